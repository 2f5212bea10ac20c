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

On CPU an op also carries its share of what encloses it and is no op we
count: the composite op it implements (``aten::linear`` around ``aten::t`` and
``aten::addmm``, ``aten::layer_norm`` around ``aten::native_layer_norm``) and
the autograd node that ran it in backward
(``autograd::engine::evaluate_function: MmBackward0``). That time is the host
cost of executing the op; left out, a tenth of a small model's forward and a
twentieth of its backward would count as "not in any op". The enclosing
event's time beyond its matched ops is split over them in proportion to their
times. On CUDA host time is not op time at all, so nothing is added there.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from advisor.probes.compute.counter import OpCall

LOOKAHEAD = 400  # events scanned for one op before it is given up as unmatched
LOOSE_WINDOW = 16  # how near a same-name event with other shapes must be to be taken
AUTOGRAD_NODE = "autograd::engine::evaluate_function"

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
    """Stop the profiler; returns its aten events sorted by start time (enclosing autograd
    nodes stay reachable through ``cpu_parent``)."""
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
    matched = match_events(calls, events)
    times = [None if e is None else event_time_s(e, use_cuda) for e in matched]
    if not use_cuda:
        charge_enclosing(times, matched)
    return times


def match_events(calls: Sequence[OpCall], events: Sequence[Any]) -> list[Any | None]:
    """The event in ``events`` (aten, by start time) that ran each counted call, or None."""
    found_at: list[Any | None] = [None] * len(calls)
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
        matched.add(id(events[found]))
        found_at[i] = events[found]
        cursor = found + 1
    return found_at


def charge_enclosing(times: list[float | None], matched: Sequence[Any | None]) -> None:
    """Add to each op its share of the outermost op or autograd node around it (in place)."""
    by_outer: dict[int, tuple[Any, list[int]]] = {}
    for i, event in enumerate(matched):
        outer = None if event is None else outermost(event)
        if outer is not None:
            by_outer.setdefault(id(outer), (outer, []))[1].append(i)
    for outer, members in by_outer.values():
        own = sum(times[i] or 0.0 for i in members)
        extra = float(outer.cpu_time_total) * _US - own
        if extra <= 0:
            continue
        for i in members:
            share = (times[i] or 0.0) / own if own > 0 else 1.0 / len(members)
            times[i] = (times[i] or 0.0) + extra * share


def outermost(event: Any) -> Any | None:
    """The topmost aten op or autograd node enclosing ``event``; None when nothing does."""
    found = None
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(("aten::", AUTOGRAD_NODE)):
            found = parent
        parent = parent.cpu_parent
    return found


def _inside_matched(event: Any, matched: set[int]) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if id(parent) in matched:
            return True
        parent = parent.cpu_parent
    return False
