"""Op times from PyTorch's profiler, joined to the ops the counter recorded.

The timed step runs without our dispatch mode, so its op times carry only the
profiler's own small per-op cost. Each counted op is matched, in order, to the
next profiler event of the same aten name (preferring equal tensor shapes)
that is not inside an event already matched: the counter sees ops below
autograd after composite ops are decomposed, the profiler sees every level,
and ops do not overlap on a thread, so an in-order walk pairs them.

Time of an op (seconds): on CPU ``FunctionEvent.cpu_time_total`` (the op and
the kernels it calls; its children are its own implementation), on CUDA
``FunctionEvent.device_time_total`` (kernel time on the device of the kernels
the op and its children launched, not the launch time).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from probes.compute.counter import OpCall

LOOKAHEAD = 400  # events scanned for one op before it is given up as unmatched
LOOSE_WINDOW = 16  # how near a same-name event with other shapes must be to be taken

_US = 1e-6


def start_profiler(use_cuda: bool) -> torch.profiler.profile:
    """Start PyTorch's profiler for one step (CPU activity, plus CUDA kernels on a GPU)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if use_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities, record_shapes=True)
    prof.__enter__()
    return prof


def stop_profiler(prof: torch.profiler.profile) -> list[Any]:
    """Stop the profiler; returns its aten events sorted by start time."""
    prof.__exit__(None, None, None)
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    events.sort(key=lambda e: e.time_range.start)
    return events


def _event_name(call_name: str) -> str:
    return call_name.replace(".", "::", 1)  # "aten.mm" -> "aten::mm"


def _shapes(value: Iterable[Any]) -> tuple[tuple[int, ...], ...]:
    # The profiler lists non-tensor arguments as []; drop empties on both sides.
    return tuple(tuple(s) for s in value if isinstance(s, (list, tuple)) and len(s) > 0
                 and all(isinstance(d, int) for d in s))


def event_time_s(event: Any, use_cuda: bool) -> float:
    """Seconds of one profiler event: device kernel time on CUDA, CPU time otherwise."""
    if use_cuda:
        return float(getattr(event, "device_time_total", 0.0)) * _US
    return float(event.cpu_time_total) * _US


def join_times(calls: Sequence[OpCall], events: Sequence[Any], *, use_cuda: bool) -> list[float | None]:
    """Time per counted call (None where no event matched), in seconds."""
    times: list[float | None] = [None] * len(calls)
    matched: set[int] = set()
    cursor = 0
    for i, call in enumerate(calls):
        name = _event_name(call.name)
        want = _shapes(call.input_shapes)
        found: int | None = None
        loose: int | None = None
        for j in range(cursor, min(len(events), cursor + LOOKAHEAD)):
            ev = events[j]
            if ev.name != name or _inside_matched(ev, matched):
                continue
            if _shapes(ev.input_shapes or ()) == want:
                found = j
                break
            if loose is None and j < cursor + LOOSE_WINDOW:
                loose = j
        if found is None:
            found = loose  # same name, shapes recorded differently (e.g. scalars as tensors)
        if found is None:
            continue
        ev = events[found]
        matched.add(id(ev))
        times[i] = event_time_s(ev, use_cuda)
        cursor = found + 1
    return times


def _inside_matched(event: Any, matched: set[int]) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if id(parent) in matched:
            return True
        parent = parent.cpu_parent
    return False
