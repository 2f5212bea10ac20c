"""Report sections for communication: collectives, per-rank exposure, stragglers.

Builders return plain dicts (the headless JSON report's contract, docs/report-schema.md);
``comm_blocks`` lays them out for the report's renderers (``advisor.blocks``).
Bandwidths are bytes per second; times are seconds.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import median
from typing import Any

from advisor.blocks import Block, Column, Table
from advisor.recommend.comm import rank_comm, straggler, wait_by_record
from advisor.records.samples import ordinary_steps
from advisor.records.bandwidth import algbw, busbw
from advisor.records.comm_cache import bench_busbw, load_cache
from advisor.records.units import fmt_bytes, fmt_rate, fmt_seconds
from advisor.rich_text import to_rich
from advisor.state import SessionState


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
    """Per rank: the median over its ordinary steps (not step 0, not deep) of
    the step time, the communication and the exposed time, and exposed over step (``RankComm``,
    the figures the communication diagnosis quotes)."""
    ranks = sorted(set(state.steps) | {c.rank for c in state.collectives})
    rows = (rank_comm(state.collectives, state.steps.get(rank, []), rank) for rank in ranks)
    return [row.to_dict() for row in rows if row is not None]


def build_straggler_section(state: SessionState) -> dict[str, Any] | None:
    """The rank the others wait for, from collectives matched across ranks; None without any.

    ``wait_caused_s``: the others' mean wait, summed over the calls this rank came last to;
    ``skew_s``: mean spread of arrival times per matched call; ``wait_s_by_rank``: each rank's
    own wait summed over calls; ``wait_per_step_s_by_rank``: its mean wait per step, each step's
    bounded by that step's time; ``per_rank_step_time_s``: the median of each rank's ordinary
    steps (as ``comm[].step_time_s``).
    """
    waits, matched = wait_by_record(state.collectives, state.events)
    report = straggler(matched)
    if report is None:
        return None
    steps = {
        str(rank): median(s.time_s for s in ordinary_steps(samples))
        for rank, samples in sorted(state.steps.items()) if samples
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


def comm_blocks(
    collectives: list[dict[str, Any]],
    comm: list[dict[str, Any]],
    straggler_section: dict[str, Any] | None,
) -> list[Block]:
    """The collectives, the communication per step and the straggler (``advisor.blocks``);
    empty when nothing was communicated. Bandwidths in one unit, bytes/s with decimal prefixes
    (``fmt_rate``, as nccl-tests quotes them): the same in the TUI."""
    out: list[Block] = []
    if collectives:
        names = ("rank", "op", "n", "size", "count", "time", "exposed", "wait", "algbw", "busbw", "bench busbw")
        out.append(Table(
            title="Collectives", caption="time, exposed and wait summed over the calls",
            columns=tuple(Column(name=c, label=True) if c == "op" else Column(name=c, numeric=True) for c in names),
            rows=tuple((str(r["rank"]), r["op"], str(r["group_size"]), fmt_bytes(r["bytes"]), str(r["count"]),
                        fmt_seconds(r["time_s"]), fmt_seconds(r["exposed_s"]), fmt_seconds(r["wait_s"]),
                        fmt_rate(r["algbw"]), fmt_rate(r["busbw"]), fmt_rate(r.get("bench_busbw")))
                       for r in collectives)))
    if comm and collectives:  # without any collective the table would be all zeros
        out.append(Table(
            title="Communication per step",
            caption="medians over each rank's ordinary steps (not step 0, not deep-sampled, not right after a deep one); comm: time with a "
                    "collective in flight",
            columns=tuple(Column(name=c, numeric=True)
                          for c in ("rank", "step time", "comm", "exposed", "exposed share")),
            rows=tuple((str(r["rank"]), fmt_seconds(r["step_time_s"]), fmt_seconds(r["comm_s"]),
                        fmt_seconds(r["exposed_s"]), f"{r['exposed_share']:.1%}") for r in comm)))
    if straggler_section is not None:
        s = straggler_section
        per_step = s.get("wait_per_step_s_by_rank") or {}
        out.append(Table(
            title=f"Straggler: rank {s['rank']}",
            caption=(f"others waited {fmt_seconds(s['wait_caused_s'])} for rank {s['rank']}; "
                     f"mean arrival skew {fmt_seconds(s['skew_s'])}; step time: median of ordinary steps, "
                     "wait: mean per step"),
            columns=tuple(Column(name=c, numeric=True) for c in ("rank", "step time", "own wait per step")),
            rows=tuple((rank, fmt_seconds(t), fmt_seconds(per_step.get(rank, 0.0)))
                       for rank, t in s["per_rank_step_time_s"].items())))
    return out


def render_comm_sections(
    collectives: list[dict[str, Any]],
    comm: list[dict[str, Any]],
    straggler_section: dict[str, Any] | None,
) -> list[Any]:
    """Rich renderables of ``comm_blocks`` (empty list when nothing was communicated)."""
    return [to_rich(block) for block in comm_blocks(collectives, comm, straggler_section)]
