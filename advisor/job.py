"""One view of a multi-node job: the sessions its controllers recorded, merged into one state.

Each node's controller writes its own session (advisor/controller.py: ``meta["job"]`` holds the
job id, rank 0's run token and the global ranks that node hosted). ``load_job`` reads several of
them (folders or ``.sqlite`` files copied from the nodes), checks that they are one run of one
job (same id, same token, same world size, no rank recorded twice) and replays all their records
into one ``SessionState``: the report then holds every rank, and cross-node stragglers and
collectives pair up by their (group, sequence number), as within one node. ``job_section`` is
the report's ``job`` object (docs/report-schema.md).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from advisor.errors import UsageError
from advisor.paths import resolve_session
from advisor.records.samples import Event
from advisor.state import LiveState, SessionState
from advisor.store import RecordReader, load_state, read_meta


def session_job(meta: dict[str, Any], db_path: Path) -> dict[str, Any]:
    """A session's job metadata; sessions recorded before multi-node support are jobs of their own."""
    job = meta.get("job") if isinstance(meta.get("job"), dict) else {}
    session_id = str(meta.get("session_id") or db_path.parent.name)
    return {"id": job.get("id") or session_id, "token": job.get("token"), "launcher": job.get("launcher", "single"),
            "id_source": job.get("id_source"),
            "world_size": job.get("world_size"), "ranks_hosted": list(job.get("ranks_hosted") or []),
            "node_rank": job.get("node_rank"), "hostname": job.get("hostname"), "decides": job.get("decides"),
            "session_id": session_id, "path": str(db_path.parent)}


def job_section(state: SessionState) -> dict[str, Any]:
    """The report's ``job``: the job id and every session (node) it was merged from."""
    job = state.job or {}
    sessions = job.get("sessions")
    if not sessions:
        sessions = [{"id": state.session_id, "path": state.session_path, "node_rank": job.get("node_rank"),
                     "hostname": job.get("hostname"), "ranks": sorted(job.get("ranks_hosted") or state.runs),
                     "decides": job.get("decides", True), "exit_code": state.exit_code}]
    return {"id": job.get("id") or state.session_id, "token": job.get("token"),
            "launcher": job.get("launcher", "single"), "id_source": job.get("id_source"),
            "world_size": state.world_size, "ranks": sorted(state.runs),
            "merged": len(sessions) > 1, "sessions": sessions}


def _check_one_job(jobs: list[dict[str, Any]]) -> None:
    ids = {j["id"] for j in jobs}
    if len(ids) > 1:
        listed = ", ".join(f"{j['session_id']} is job {j['id']}" for j in jobs)
        raise UsageError(f"these sessions are of different jobs ({listed})",
                         hint="merge only the sessions of one job, one per node (`advisor report --format json "
                              "SESSION` shows job.id)")
    tokens = {j["token"] for j in jobs if j["token"]}
    if len(tokens) > 1:
        raise UsageError(f"these sessions are of different runs of job {jobs[0]['id']} (their rank 0 tokens differ)",
                         hint="a job id reused by a restart or a later run: merge the sessions of one run")
    sizes = {j["world_size"] for j in jobs if j["world_size"]}
    if len(sizes) > 1:
        raise UsageError(f"these sessions disagree on the world size ({sorted(sizes)})",
                         hint="merge the sessions of one run of the job")
    seen: dict[int, str] = {}
    for j in jobs:
        for rank in j["ranks_hosted"]:
            if rank in seen:
                raise UsageError(f"rank {rank} is in two sessions ({seen[rank]} and {j['session_id']})",
                                 hint="pass each node's session once")
            seen[rank] = j["session_id"]


class _Ended:
    """How one node's session ended, from its metadata."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.finished = bool(meta.get("finished"))
        code = meta.get("exit_code")
        self.exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
        self.exit_reason = str(meta.get("exit_reason") or "")


def split_refs(ref: str) -> list[str]:
    """``A1,A2``: the sessions of one job, for commands that take one session per argument
    (``advisor diff``); a path that itself contains a comma stays whole."""
    if "," not in ref or Path(ref).exists():
        return [ref]
    return [part for part in ref.split(",") if part]


def load_job(refs: list[str]) -> SessionState:
    """One session (as ``load_state``), or several of one job merged into one state."""
    paths = [resolve_session(ref) for ref in refs]
    unique = list(dict.fromkeys(p.resolve() for p in paths))
    if len(unique) < len(paths):
        raise UsageError("the same session was given twice", hint="pass each node's session once")
    if len(paths) == 1:
        return load_state(paths[0])
    metas = [read_meta(p) for p in paths]
    jobs = [session_job(meta, p) for meta, p in zip(metas, paths)]
    _check_one_job(jobs)
    # The deciding node's session first: its records lead, and its id names the merged view.
    order = sorted(range(len(paths)), key=lambda i: (not jobs[i]["decides"], min(jobs[i]["ranks_hosted"] or [1 << 30])))
    merged = LiveState(session_id=jobs[order[0]]["session_id"], session_path=jobs[order[0]]["path"])
    for i in order:
        reader = RecordReader(paths[i])
        records = iter(reader)
        first = next(records, None)  # reading starts: old steps are summed into reader.totals
        if reader.totals:  # before this session's recent steps fold in on top (ranks differ by node)
            merged.update(step_totals={**merged.snapshot().step_totals, **reader.totals})
        for record in itertools.chain([first] if first is not None else [], records):
            try:
                merged.add(record)
            except Exception as exc:  # noqa: BLE001 - one record must never cost the session
                reader.dropped += 1
                reader.last_problem = f"{type(exc).__name__}: {exc}"[:300]
        if reader.dropped:
            merged.add(Event(name="warning", data={"message": f"{paths[i].parent.name}: {reader.dropped} malformed "
                                                              f"record(s) dropped (last: {reader.last_problem})"}))
        if reader.damaged:
            merged.add(Event(name="warning", data={"message": reader.damaged}))
    states = [_Ended(metas[i]) for i in order]
    sessions = []
    for i, state in zip(order, states):
        job = jobs[i]
        sessions.append({"id": job["session_id"], "path": job["path"], "node_rank": job["node_rank"],
                         "hostname": job["hostname"], "ranks": sorted(job["ranks_hosted"]),
                         "decides": job["decides"], "exit_code": state.exit_code})
    first_job = jobs[order[0]]
    merged.update(job={**first_job, "token": next((j["token"] for j in jobs if j["token"]), None),
                       "sessions": sessions})
    failed = [(s, st) for s, st in zip(sessions, states) if st.exit_code]
    finished = all(st.finished for st in states)
    if finished:
        culprit = failed[0] if failed else None
        code = culprit[1].exit_code if culprit else 0
        reasons = "; ".join(f"ranks {s['ranks']}: {st.exit_reason}" for s, st in zip(sessions, states))
        merged.update(finished=True, exit_code=code, exit_reason=reasons)
    else:
        running = [s["id"] for s, st in zip(sessions, states) if not st.finished]
        merged.add(Event(name="warning", data={"message": f"session(s) {', '.join(running)} had not finished "
                                                          "when read: the merged view is partial"}))
    return merged.snapshot()
