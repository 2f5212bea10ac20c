"""Export a session as Chrome/Perfetto trace JSON (chrome://tracing, ui.perfetto.dev)."""

from __future__ import annotations

import json
from typing import Any

from advisor.sections.memory import memory_trace_events
from advisor.state import SessionState

_PHASES = ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s")


def step_trace_events(state: SessionState) -> list[dict[str, Any]]:
    """One complete ("X") event per step and per phase, per rank (pid = rank), in microseconds."""
    events: list[dict[str, Any]] = []
    for rank, samples in state.steps.items():
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for s in samples:
            start = (s.end_time - s.time_s) * 1e6
            events.append({"ph": "X", "name": f"step {s.index}", "pid": rank, "tid": 0, "ts": start,
                           "dur": s.time_s * 1e6, "args": {"loss": s.loss}})
            cursor = start
            for key in _PHASES:  # phases are contiguous in this order only approximately; shown as a stack
                duration = s.phases.get(key, 0.0) * 1e6
                if duration > 0:
                    events.append({"ph": "X", "name": key[:-2], "pid": rank, "tid": 1, "ts": cursor, "dur": duration})
                    cursor += duration
    return events


def write_trace(state: SessionState, path: str) -> None:
    events = step_trace_events(state) + memory_trace_events(state)
    with open(path, "w") as handle:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, handle)
