"""Export a session as Chrome/Perfetto trace JSON (chrome://tracing, ui.perfetto.dev).

One time base: every event's ``ts`` is microseconds on the wall clock (epoch), placed from each
step's own end time (``StepSample.end_time``, epoch seconds) and duration. Memory counters sit at
their step's start plus ``MemorySample.time``; the deep steps' ops sit inside their phase.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from advisor.records.samples import MEMORY_CATEGORIES
from advisor.state import SessionState

_PHASES = ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s")
TID_STEPS, TID_PHASES, TID_OPS = 0, 1, 2


def step_starts(state: SessionState) -> dict[tuple[int, int], float]:
    """(rank, step index) -> the step's start, epoch seconds."""
    return {(s.rank, s.index): s.end_time - s.time_s for samples in state.steps.values() for s in samples}


def _phase_starts(sample: Any) -> dict[str, float]:
    """Each phase's start in epoch seconds, phases laid end to end in their usual order."""
    cursor = sample.end_time - sample.time_s
    out = {}
    for key in _PHASES:
        out[key[:-2]] = cursor
        cursor += sample.phases.get(key, 0.0)
    return out


def step_trace_events(state: SessionState) -> list[dict[str, Any]]:
    """One complete ("X") event per step and per phase, per rank (pid = rank), in microseconds."""
    events: list[dict[str, Any]] = []
    for rank, samples in state.steps.items():
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for tid, name in ((TID_STEPS, "steps"), (TID_PHASES, "phases"), (TID_OPS, "ops (deep steps)")):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        for s in samples:
            start = (s.end_time - s.time_s) * 1e6
            events.append({"ph": "X", "name": f"step {s.index}", "pid": rank, "tid": TID_STEPS, "ts": start,
                           "dur": s.time_s * 1e6, "args": {"loss": s.loss, "deep": s.deep}})
            for key, phase_start in _phase_starts(s).items():
                duration = s.phases.get(f"{key}_s", 0.0) * 1e6
                if duration > 0:
                    events.append({"ph": "X", "name": key, "pid": rank, "tid": TID_PHASES,
                                   "ts": phase_start * 1e6, "dur": duration})
    return events


def op_trace_events(state: SessionState) -> list[dict[str, Any]]:
    """The deep steps' ops, inside the phase that ran them, in descending time.

    Op records are aggregates per signature (no start times), so their slices are laid end to
    end from the phase's start; where the profiler's times add up to more than the phase (nested
    ops), the slices are shrunk to fit and ``args.measured_s`` keeps the measured time.
    """
    samples = {(s.rank, s.index): s for rank_steps in state.steps.values() for s in rank_steps}
    groups: dict[tuple[int, int, str], list[Any]] = defaultdict(list)
    for op in state.ops:
        groups[(op.rank, op.step, op.phase)].append(op)
    events: list[dict[str, Any]] = []
    for (rank, step, phase), ops in sorted(groups.items()):
        sample = samples.get((rank, step))
        if sample is None:
            continue
        start = _phase_starts(sample).get(phase, sample.end_time - sample.time_s)
        span = sample.phases.get(f"{phase}_s") or sample.time_s
        total = sum(op.time_s for op in ops)
        fit = min(1.0, span / total) if total > 0 else 1.0
        cursor = start
        for op in sorted(ops, key=lambda o: o.time_s, reverse=True):
            duration = op.time_s * fit
            events.append({"ph": "X", "name": op.name, "pid": rank, "tid": TID_OPS, "ts": cursor * 1e6,
                           "dur": duration * 1e6,
                           "args": {"step": step, "module": op.module, "phase": phase, "count": op.count,
                                    "flops": op.flops, "bytes": op.bytes, "measured_s": op.time_s,
                                    "dtype": op.dtype}})
            cursor += duration
    return events


def memory_trace_events(state: SessionState) -> list[dict[str, Any]]:
    """Counter events ("ph": "C"), one per memory sample, at its step's start plus its time."""
    starts = step_starts(state)
    events: list[dict[str, Any]] = []
    for sample in state.memory:
        start = starts.get((sample.rank, sample.step))
        if start is None:
            continue  # a sample of a step whose StepSample never arrived has no place on the clock
        events.append({"name": "memory by category", "ph": "C", "ts": round((start + sample.time) * 1e6, 3),
                       "pid": sample.rank, "tid": 0,
                       "args": {c: int(sample.categories.get(c, 0)) for c in MEMORY_CATEGORIES}})
    events.sort(key=lambda e: (e["pid"], e["ts"]))
    return events


def write_trace(state: SessionState, path: str) -> None:
    events = step_trace_events(state) + op_trace_events(state) + memory_trace_events(state)
    with open(path, "w") as handle:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, handle)
