"""Report sections for communication: collectives, per-rank exposure, stragglers.

Builders return plain dicts (the headless JSON report's contract, docs/report-schema.md);
``render_comm_sections`` turns them into rich renderables for the TUI and the printer.
Bandwidths are bytes per second; times are seconds.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from rich.table import Table

from advisor.state import SessionState
from advisor.records.comm_cache import bench_busbw, load_cache
from advisor.records.bandwidth import algbw, busbw
from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.recommend.comm import step_comm, straggler, wait_by_record


def _call_wait(c: Any, waits: dict[int, float]) -> float:
    """A call's wait for the latest rank: part of the call's own time, so never more than it."""
    return min(c.time_s, max(c.wait_s, waits.get(id(c), 0.0)))


def wait_per_step(state: SessionState, waits: dict[int, float]) -> dict[int, float]:
    """Per rank, its mean wait per step: each step's waits summed and bounded by that step's own
    time (``StepSample.time_s``), so a wait never exceeds the step it belongs to."""
    step_time = {(s.rank, s.index): s.time_s for samples in state.steps.values() for s in samples}
    per_step: dict[tuple[int, int], float] = defaultdict(float)
    for c in state.collectives:
        per_step[(c.rank, c.step)] += _call_wait(c, waits)
    by_rank: dict[int, list[float]] = defaultdict(list)
    for (rank, step), wait in per_step.items():
        bound = step_time.get((rank, step))
        by_rank[rank].append(min(wait, bound) if bound else wait)
    out = {}
    for rank, values in by_rank.items():
        n = len(state.steps.get(rank) or []) or len(values)
        out[rank] = sum(values) / n
    return out


def build_collectives_section(state: SessionState) -> list[dict[str, Any]]:
    """One row per (rank, op, group size, bytes): totals over all recorded calls.

    ``time_s``, ``exposed_s`` and ``wait_s`` are sums over ``count`` calls; ``algbw`` and
    ``busbw`` (nccl-tests conventions) use the transfer time, i.e. the call's time minus the
    time it waited for the latest rank, so a straggler does not read as a slow link.
    ``bench_busbw`` is the cached ``advisor bench-comm`` figure at the nearest size, or None.
    """
    waits, _ = wait_by_record(state.collectives, state.events)
    groups: dict[tuple[int, str, int, int], dict[str, Any]] = {}
    for c in state.collectives:
        key = (c.rank, c.op, c.group_size, c.bytes)
        row = groups.setdefault(
            key,
            {"op": c.op, "rank": c.rank, "group_size": c.group_size, "count": 0, "bytes": c.bytes,
             "time_s": 0.0, "exposed_s": 0.0, "wait_s": 0.0},
        )
        row["count"] += c.count
        row["time_s"] += c.time_s
        row["exposed_s"] += c.exposed_s
        row["wait_s"] += _call_wait(c, waits)
    cache = load_cache()
    out = []
    for key in sorted(groups):
        row = groups[key]
        transfer = max(0.0, row["time_s"] - row["wait_s"])
        total_bytes = row["bytes"] * row["count"]
        row["algbw"] = algbw(total_bytes, transfer)
        row["busbw"] = busbw(row["op"], total_bytes, transfer, row["group_size"])
        row["bench_busbw"] = (
            bench_busbw(cache, op=row["op"], nbytes=row["bytes"], world_size=row["group_size"]) if cache else None
        )
        out.append(row)
    return out


def build_comm_section(state: SessionState) -> list[dict[str, Any]]:
    """Per rank: mean step time, and per step the communication and exposed time and share."""
    rows = step_comm(state.collectives, state.steps)
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_rank[r["rank"]].append(r)
    out = []
    for rank, items in sorted(by_rank.items()):
        step_time = mean(r["step_time_s"] for r in items)
        exposed = mean(r["exposed_s"] for r in items)
        out.append(
            {
                "rank": rank,
                "step_time_s": step_time,
                "comm_s": mean(r["comm_s"] for r in items),
                "exposed_s": exposed,
                "exposed_share": exposed / step_time if step_time > 0 else 0.0,
            }
        )
    return out


def build_straggler_section(state: SessionState) -> dict[str, Any] | None:
    """The rank the others wait for, from collectives matched across ranks; None without any.

    ``wait_caused_s``: the others' mean wait, summed over the calls this rank came last to;
    ``skew_s``: mean spread of arrival times per matched call; ``wait_s_by_rank``: each rank's
    own wait summed over calls; ``wait_per_step_s_by_rank``: its mean wait per step, each step's
    bounded by that step's time; ``per_rank_step_time_s``: mean StepSample time per rank.
    """
    waits, matched = wait_by_record(state.collectives, state.events)
    report = straggler(matched)
    if report is None:
        return None
    steps = {
        str(rank): mean(s.time_s for s in samples) for rank, samples in sorted(state.steps.items()) if samples
    }
    n_steps = max((len(s) for s in state.steps.values()), default=0)
    return {
        "rank": report.rank,
        "wait_caused_s": report.wait_caused_s[report.rank],
        "wait_caused_per_step_s": report.wait_caused_s[report.rank] / n_steps if n_steps else None,
        "skew_s": report.skew_s,
        "per_rank_step_time_s": steps,
        "wait_s_by_rank": {str(r): w for r, w in sorted(report.wait_s.items())},
        "wait_per_step_s_by_rank": {str(r): w for r, w in sorted(wait_per_step(state, waits).items())},
        "matched_calls": report.calls,
    }


def _bw(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.2f} GB/s"


def render_comm_sections(
    collectives: list[dict[str, Any]],
    comm: list[dict[str, Any]],
    straggler_section: dict[str, Any] | None,
) -> list[Any]:
    """Rich renderables for the three sections (empty list when nothing was communicated)."""
    out: list[Any] = []
    if collectives:
        table = Table(title="Collectives")
        for col in ("rank", "op", "n", "size", "count", "time", "exposed", "wait", "algbw", "busbw", "bench busbw"):
            table.add_column(col, justify="left" if col == "op" else "right", no_wrap=col != "op", overflow="fold")
        for r in collectives:
            table.add_row(
                str(r["rank"]), r["op"], str(r["group_size"]), fmt_bytes(r["bytes"]), str(r["count"]),
                fmt_seconds(r['time_s']), fmt_seconds(r['exposed_s']), fmt_seconds(r['wait_s']),
                _bw(r["algbw"]), _bw(r["busbw"]), _bw(r.get("bench_busbw")),
            )
        out.append(table)
    if comm and collectives:  # without any collective the table would be all zeros
        table = Table(title="Communication per step")
        for col in ("rank", "step time", "comm", "exposed", "exposed share"):
            table.add_column(col, justify="right", no_wrap=True)
        for r in comm:
            table.add_row(
                str(r["rank"]), fmt_seconds(r['step_time_s']), fmt_seconds(r['comm_s']),
                fmt_seconds(r['exposed_s']), f"{r['exposed_share']:.1%}",
            )
        out.append(table)
    if straggler_section is not None:
        s = straggler_section
        table = Table(title=f"Straggler: rank {s['rank']}")
        table.add_column("rank", justify="right")
        table.add_column("step time", justify="right")
        table.add_column("own wait per step", justify="right")
        per_step = s.get("wait_per_step_s_by_rank") or {}
        for rank, t in s["per_rank_step_time_s"].items():
            table.add_row(rank, fmt_seconds(t), fmt_seconds(per_step.get(rank, 0.0)))
        table.caption = (
            f"others waited {fmt_seconds(s['wait_caused_s'])} for rank {s['rank']}; "
            f"mean arrival skew {fmt_seconds(s['skew_s'])}"
        )
        out.append(table)
    return out
