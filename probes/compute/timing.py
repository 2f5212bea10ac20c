"""Op times from PyTorch's profiler, joined to the ops the counter recorded.

The timed step runs without our dispatch mode, so its op times carry only the
profiler's own small per-op cost. The counter sees ops below autograd after
composite ops are decomposed, the profiler sees every level; ops do not
overlap on a thread, so the counted ops and the profiler's events no counted
op encloses form two nearly equal sequences, joined in order on exact
(name, shapes) keys (``match_events``).

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

import bisect
from typing import Any, Iterable, Sequence

import torch

from advisor.probes.compute.counter import OpCall
from advisor.probes.fork_guard import guard_forks

LOOKAHEAD = 400  # how far (calls or events) the walk looks to resynchronise after a mismatch
CONFIRM = 3  # keys in a row that must agree for the walk to resynchronise there
AUTOGRAD_NODE = "autograd::engine::evaluate_function"

_US = 1e-6


def start_profiler(use_cuda: bool) -> torch.profiler.profile | None:
    """Start PyTorch's profiler for one step (CPU activity, plus CUDA kernels on a GPU); None when
    another profiler (the user's, or the comm probe's) already runs: kineto holds one session."""
    if torch.autograd.profiler._is_profiler_enabled:
        return None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if use_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities, record_shapes=True)
    prof.__enter__()
    guard_forks()  # kineto's loader thread now exists: keep it out of the script's forked children
    return prof


def stop_profiler(prof: torch.profiler.profile, *, use_cuda: bool = True) -> list[Any]:
    """Stop the profiler; returns its aten events sorted by start time (enclosing autograd
    nodes stay reachable through ``cpu_parent``).

    The events are read from the profiler's raw kineto results (``raw_events``), not PyTorch's
    ``FunctionEvent`` tree: building that tree cost 130-330 ms for a 45 ms GPT step on this
    project's CPU (7 light steps) and 1.3 s for a 14 ms one on an H200 (91); the raw walk costs
    about 10 ms on the CPU. PyTorch's tree is the fallback where the raw results are missing."""
    prof.__exit__(None, None, None)
    raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if raw is not None:
        return raw_events(raw.events(), use_cuda=use_cuda)
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    events.sort(key=lambda e: e.time_range.start)
    return events


class RawEvent:
    """The part of a profiler ``FunctionEvent`` that the join reads, from one raw kineto CPU event."""

    __slots__ = ("name", "_raw", "_shapes", "start_ns", "end_ns", "thread", "cpu_parent", "correlation",
                 "device_time_total")

    def __init__(self, raw: Any) -> None:
        self.name: str = raw.name()
        # Shapes are read when the join asks (``input_shapes``): only the candidates are joined on
        # them, and the walk read them for every aten event (5 607 for a small GPT step's 1 872
        # counted ops)
        self._raw = raw
        self._shapes: Any = None
        self.start_ns: int = raw.start_ns()
        self.end_ns: int = self.start_ns + raw.duration_ns()
        self.thread: int = raw.start_thread_id()
        # PyTorch's own op events (linked to nothing) are the ones kernels are joined to: a CUDA
        # runtime call's id is CUPTI's, from another numbering
        self.correlation: int = raw.correlation_id() if raw.linked_correlation_id() == 0 else 0
        self.cpu_parent: RawEvent | None = None
        self.device_time_total = 0.0  # microseconds of the kernels it and its children launched

    @property
    def input_shapes(self) -> Any:
        """The event's recorded input shapes (``FunctionEvent.input_shapes``); () for non-aten events."""
        if self._shapes is None:
            self._shapes = self._raw.shapes() if self.name.startswith("aten::") else ()
        return self._shapes

    @property
    def cpu_time_total(self) -> float:
        """Microseconds, as ``FunctionEvent.cpu_time_total``."""
        return (self.end_ns - self.start_ns) / 1000.0


def raw_events(events: Iterable[Any], *, use_cuda: bool = False) -> list[RawEvent]:
    """The aten events among kineto's CPU events, in start order, each linked to the innermost
    event of its thread whose interval holds it (``cpu_parent``), as PyTorch's parser links them.
    With ``use_cuda``, each carries the time of the CUDA kernels it and the ops inside it launched
    (``device_time_total``, microseconds): a kernel names its launching op's correlation id
    (``linked_correlation_id``), as PyTorch's parser joins them."""
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    found: list[RawEvent] = []
    kernel_us: dict[int, float] = {}
    for event in events:
        kind = event.device_type()
        if kind == cpu:
            if use_cuda and event.linked_correlation_id() > 0:
                continue  # a CUDA runtime call (cudaLaunchKernel): inside an op, never around one
            if not (event.is_async() or event.start_thread_id() != event.end_thread_id()):
                found.append(RawEvent(event))  # async events are nobody's parent or child
        elif use_cuda and kind == cuda and event.linked_correlation_id() > 0:
            key = event.linked_correlation_id()
            kernel_us[key] = kernel_us.get(key, 0.0) + event.duration_ns() / 1000.0
    found.sort(key=lambda e: (e.thread, e.start_ns, -e.end_ns))
    stack: list[RawEvent] = []
    for event in found:
        if stack and stack[-1].thread != event.thread:
            stack = []
        while stack and stack[-1].end_ns < event.end_ns:
            stack.pop()
        event.cpu_parent = stack[-1] if stack else None
        stack.append(event)
    for event in found:
        own = kernel_us.get(event.correlation, 0.0) if event.correlation > 0 else 0.0
        holder: RawEvent | None = event
        while own and holder is not None:  # inclusive, as FunctionEvent.device_time_total
            holder.device_time_total += own
            holder = holder.cpu_parent
    aten = [e for e in found if e.name.startswith("aten::")]
    aten.sort(key=lambda e: e.start_ns)
    return aten


def _event_name(call_name: str) -> str:
    return call_name.replace(".", "::", 1)  # "aten.mm" -> "aten::mm"


_INT = frozenset({int})


def _shapes(value: Iterable[Any]) -> tuple[tuple[int, ...], ...]:
    # The profiler lists non-tensor arguments as []; drop empties on both sides. The test that
    # every dimension is an int runs in C (``set(map(type, s))``): a generator per shape cost
    # 1.8 s over the 170 000 shapes of a 5001-module model's profiled step.
    return tuple(tuple(s) for s in value if isinstance(s, (list, tuple)) and s and set(map(type, s)) <= _INT)


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
    """The event in ``events`` (aten, by start time) that ran each counted call, or None.

    Only events no counted op encloses can be counted ops (the counter never sees what an op
    calls inside itself), so those are dropped first; what remains is the counted sequence
    with a few insertions on either side (the memory tracker's ``detach`` in one step and not
    the other, a lazily created buffer). The two sequences are walked together on exact
    (name, shapes) keys; at a mismatch the walk resynchronises at the nearest pair of
    positions where ``CONFIRM`` keys in a row agree again, and pairs same-name ops only inside
    the gap it skipped. A loose match can therefore never carry the walk past real ops, which
    is what timed 50-96% of the FLOPs at 0 s (issue 21, item 10).
    """
    candidates = _outer_events(events, {_event_name(c.name) for c in calls})
    call_keys = [(_event_name(c.name), _shapes(c.input_shapes)) for c in calls]
    event_keys = [(e.name, _shapes(e.input_shapes or ())) for e in candidates]
    positions: dict[tuple, list[int]] = {}
    for j, key in enumerate(event_keys):
        positions.setdefault(key, []).append(j)
    runs: dict[tuple, list[int]] = {}  # CONFIRM keys in a row -> where they start among the events
    for j in range(len(event_keys) - CONFIRM + 1):
        runs.setdefault(tuple(event_keys[j:j + CONFIRM]), []).append(j)
    found_at: list[Any | None] = [None] * len(calls)
    i = j = 0
    while i < len(calls) and j < len(candidates):
        if call_keys[i] == event_keys[j]:
            found_at[i] = candidates[j]
            i, j = i + 1, j + 1
            continue
        jump = _resync(call_keys, event_keys, positions, i, j, runs)
        if jump is None:
            i += 1  # nothing agrees nearby: this call ran no event we can find
            continue
        di, dj = jump
        _pair_by_name(call_keys, event_keys, candidates, found_at, range(i, i + di), range(j, j + dj))
        i, j = i + di, j + dj
    return found_at


def _outer_events(events: Sequence[Any], counted_names: set[str]) -> list[Any]:
    """Events of a counted op's name with no enclosing event of such a name, in start order.

    An event of a name the counter never saw cannot be a counted call: the composite ops
    around the counted ones (``aten::layer_norm`` around ``aten::native_layer_norm``,
    ``aten::linear``, ``aten::reshape``, ``aten::item``) and the autograd wrappers. Kept, each
    was an insertion the walk had to resynchronise over: 289 times for one step of an 8-layer
    GPT on an H100 (127 of the timed deep step's 345 ms under cProfile), and a resynchronisation
    can leave ops unmatched (docs/accuracy.md, "Op-time coverage")."""
    out = []
    for event in events:
        if event.name not in counted_names:
            continue
        parent = event.cpu_parent
        while parent is not None and parent.name not in counted_names:
            parent = parent.cpu_parent
        if parent is None:
            out.append(event)
    return out


def _agree(call_keys: list[tuple], event_keys: list[tuple], a: int, b: int) -> bool:
    """Whether the keys from (a, b) on agree for ``CONFIRM`` positions (or to the end)."""
    n = min(CONFIRM, len(call_keys) - a, len(event_keys) - b)
    return n > 0 and all(call_keys[a + k] == event_keys[b + k] for k in range(n))


def _resync(call_keys: list[tuple], event_keys: list[tuple], positions: dict[tuple, list[int]],
            i: int, j: int, runs: dict[tuple, list[int]] | None = None) -> tuple[int, int] | None:
    """The smallest skip (calls, events) after which the sequences agree again, or None.

    ``runs`` (events by the ``CONFIRM`` keys starting there) gives the positions that agree at
    once; without it every position of a matching first key is checked key by key, which cost
    1.7 s for one 14 ms GPT step on an H200 (161 resynchronisations, 750 000 checks). Positions
    too near the end for a full run are checked key by key as before: the result is the same."""
    best: tuple[int, int] | None = None
    tail = len(event_keys) - CONFIRM + 1  # events from here have fewer than CONFIRM keys left
    for di in range(min(LOOKAHEAD, len(call_keys) - i)):
        if best is not None and di >= sum(best):
            break
        a = i + di
        exact = runs is not None and a + CONFIRM <= len(call_keys)
        found = runs.get(tuple(call_keys[a:a + CONFIRM]), ()) if exact else positions.get(call_keys[a], ())
        for b in _candidates(found, j, tail, event_keys, call_keys[a], exact):
            dj = b - j
            if dj >= LOOKAHEAD or (best is not None and di + dj >= sum(best)):
                break
            if (di, dj) != (0, 0) and (exact and b < tail or _agree(call_keys, event_keys, a, b)):
                best = (di, dj)
                break
    return best


def _candidates(found: Sequence[int], j: int, tail: int, event_keys: list[tuple], key: tuple,
                exact: bool) -> Iterable[int]:
    """Event positions from ``j`` on that may agree, in order: ``found``'s, then (for runs) the
    few near the end whose first key matches."""
    yield from found[bisect.bisect_left(found, j):]
    if exact:
        yield from (b for b in range(max(j, tail, 0), len(event_keys)) if event_keys[b] == key)


def _pair_by_name(call_keys: list[tuple], event_keys: list[tuple], candidates: Sequence[Any],
                  found_at: list[Any | None], call_range: range, event_range: range) -> None:
    """Inside a skipped gap, pair calls to same-name events in order (shapes recorded
    differently, such as a scalar passed as a tensor)."""
    next_event = event_range.start
    for i in call_range:
        for b in range(next_event, event_range.stop):
            if event_keys[b][0] == call_keys[i][0]:
                found_at[i] = candidates[b]
                next_event = b + 1
                break


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
