"""ComputeProbe: per-op FLOPs, bytes and time on deep-sampled steps.

Why two steps: the counting dispatch mode costs tens of microseconds of Python
per op, which would inflate the op times the profiler reports. So the probe
counts on one deep step (dispatch mode plus module hooks) and asks the agent
(``ctx.request_deep(1, probes=("compute",))``) to deep-sample the next step for it
alone, which it times with the profiler alone; the two op sequences are joined in order
(timing.py). Training steps repeat the same ops, so the counts of one step describe the next.
Both steps are the probe's alone (``deep_solo``, ``solo_steps = 2``): the agent books them
right after the first step of a run of deep steps, which the other probes take. With the memory
tracker's mode under it, the profiler's op times held the tracker's Python, and counting beside
the tracker put every op through two dispatch modes (3.6-5.6x a light GPT step with two threads).

When no timed step follows (the run ended, or the agent ignored the request),
the counted step is emitted with the counter's inline times on CPU (inflated by
the mode) and 0.0 on CUDA, where inline time would be launch time. A CPU step of more than
``MAX_PROFILED_OPS`` ops is emitted that way at once, with a warning: the profiler's step would
hold every op's event in memory.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from advisor.probes.compute.counter import OpCall, OpCounter
from advisor.probes.compute.modules import ModuleTracker
from advisor.probes.compute.timing import join_times, start_profiler, stop_profiler
from advisor.probes.device.spec import detect_device_spec
from advisor.probes.probe import AgentContext, Probe
from advisor.records.samples import Event, OpStat
from advisor.records.table import TableBuilder

_PHASES = {"forward": "forward", "backward": "backward", "optimizer": "optimizer"}
# Beyond this many counted ops a CPU step's ops are timed inside the counting mode instead of on a
# profiled step of their own: the profiler's memory and time grow with the ops (about 5 KiB and
# 0.1 ms each), which bounds the deep steps of a model of thousands of small modules.
MAX_PROFILED_OPS = 50_000


def op_phase(ctx: AgentContext) -> str:
    """The OpStat phase now: "forward" | "backward" | "optimizer" | "other"."""
    if ctx.in_backward():
        return "backward"
    return _PHASES.get(ctx.phase, "other")


def aggregate(calls: list[OpCall], times: list[float | None], *, rank: int, step: int,
              inline: bool = False) -> list[OpStat]:
    """One OpStat per (name, module, phase, shapes, dtype), totals over the step."""
    return [OpStat(rank=rank, step=step, **dict(zip(OP_ROW_FIELDS, row)))
            for row in signature_rows(calls, times, inline=inline)]


# An OpStat's fields but rank and step, in the order ``signature_rows`` gives them.
OP_ROW_FIELDS = ("name", "module", "phase", "input_shapes", "dtype", "count", "flops", "bytes", "time_s", "inline")


def signature_rows(calls: list[OpCall], times: list[float | None], *, inline: bool = False) -> list[tuple]:
    """``aggregate``'s records as tuples of their fields but rank and step (``OP_ROW_FIELDS``),
    for a table of them: 30,000 rows at 5001 modules, a dict each cost 0.1 s more."""
    groups: dict[tuple, list[Any]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for call, t in zip(calls, times):
        key = (call.name, call.module, call.phase, call.input_shapes, call.dtype)
        g = groups[key]
        g[0] += 1
        g[1] += call.flops
        g[2] += call.bytes
        g[3] += t or 0.0
    # One list form per distinct shapes (a model of 2500 identical layers has a handful among 30,000
    # groups); records are never changed after they are made, so they may share it.
    as_lists: dict[tuple, list[list[int]]] = {}
    for _, _, _, shapes, _ in groups:
        if shapes not in as_lists:
            as_lists[shapes] = [list(s) for s in shapes]
    return [(name, module, phase, as_lists[shapes], dtype, count, flops, nbytes, time_s, inline)
            for (name, module, phase, shapes, dtype), (count, flops, nbytes, time_s) in groups.items()]


class ComputeProbe(Probe):
    """Counts on a deep step, times on the next; emits ``OpStat`` records.

    ``emit_device_spec``: at the first deep step, detect the device's ceilings
    (advisor.probes.device.spec) and emit ``Event(name="device_spec", data=spec.to_dict())``.
    Leave it False when the agent sends that event itself.
    """

    name = "compute"
    dispatch_mode_deep = True  # the op counter (its timed step runs only after it)
    # Its steps are its alone (Agent._deep_schedule): on a step the memory tracker also samples,
    # the profiler's op times included the tracker's dispatch-mode Python (79 ms of ops in a 46 ms
    # GPT step on CPU), and counting beside it made the step several light steps long.
    deep_solo = True
    solo_steps = 2  # a run of deep steps gives it two of its own: it counts, then times (Agent._deep_schedule)

    def __init__(self, *, emit_device_spec: bool = False, max_profiled_ops: int = MAX_PROFILED_OPS) -> None:
        self._emit_spec = emit_device_spec
        self.max_profiled_ops = max_profiled_ops
        self._spec_sent = False
        self._counter: OpCounter | None = None
        self._tracker: ModuleTracker | None = None
        self._profiler: torch.profiler.profile | None = None
        self._pending: list[OpCall] | None = None  # counted, waiting for its timed step
        self._pending_step = -1
        self._bounded_step = -2  # the last step counted beyond max_profiled_ops (or skipped after one)

    def _use_cuda(self, ctx: AgentContext) -> bool:
        return ctx.device.type == "cuda" and torch.cuda.is_available()

    def start_deep(self, ctx: AgentContext, step: int) -> None:
        if self._emit_spec and not self._spec_sent:
            self._send_spec(ctx)
        if self._pending is not None and step == self._pending_step + 1:
            self._profiler = start_profiler(self._use_cuda(ctx))
            return
        if step == self._bounded_step + 1:  # the step after one timed where it was counted: one count
            self._bounded_step = step  # of a step that large is enough for this run of deep steps
            return
        self._flush_pending(ctx)
        tracker = ModuleTracker(ctx.module_name)

        def where() -> tuple[str, str]:
            phase = op_phase(ctx)
            if phase != "backward":
                tracker.end_backward()
            return tracker.current(phase == "backward"), phase

        tracker.start(ctx)
        self._tracker = tracker
        self._counter = OpCounter(where)
        self._counter.__enter__()

    def stop_deep(self, ctx: AgentContext, step: int) -> None:
        if self._profiler is not None:
            events = stop_profiler(self._profiler, use_cuda=self._use_cuda(ctx))
            self._profiler = None
            calls = self._pending or []
            times = join_times(calls, events, use_cuda=self._use_cuda(ctx))
            self._emit(ctx, calls, times, step)
            self._pending = None
            return
        if self._counter is None:
            return
        self._counter.__exit__(None, None, None)
        if self._tracker is not None:
            self._tracker.stop()
        self._pending, self._pending_step = self._counter.calls, step
        self._counter = self._tracker = None
        if ctx.settings.fit is not None:  # ``advisor fit``: fake ops take no time; the roofline times them
            self._flush_pending(ctx)
            return
        if len(self._pending) > self.max_profiled_ops and not self._use_cuda(ctx):
            # The profiler keeps every op's event with its shapes: at 85 000 ops (a model of 5001
            # small modules) its step took the training process from 0.4 to 1.6 GiB and 10 s.
            ctx.emit(Event(rank=ctx.rank, step=step, name="warning", data={
                "source": "compute", "message": (
                    f"op times of step {step} are the counting step's own ({len(self._pending)} ops, more than "
                    f"the {self.max_profiled_ops} the profiler's step is run for, which keeps every op's event "
                    "in memory): each op is timed inside the counting mode, a little slower than it runs alone")}))
            self._flush_pending(ctx)
            self._bounded_step = step
            ctx.release_deep((self.name,))  # the step booked to time them is a light one
            return
        ctx.request_deep(1, probes=(self.name,))

    def detach(self, ctx: AgentContext) -> None:
        if self._counter is not None:
            self.stop_deep(ctx, ctx.step)
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self._profiler = None
        self._flush_pending(ctx)

    def _flush_pending(self, ctx: AgentContext) -> None:
        """Emit a counted step that got no timed step, with the fallback times."""
        if self._pending is None:
            return
        cuda = self._use_cuda(ctx)
        times: list[float | None] = [0.0 if cuda else c.inline_s for c in self._pending]
        self._emit(ctx, self._pending, times, self._pending_step, inline=not cuda)
        self._pending = None

    def _emit(self, ctx: AgentContext, calls: list[OpCall], times: list[float | None], step: int,
              inline: bool = False) -> None:
        # As columns (advisor/records/table.py): 30,000 signatures at 5001 modules.
        rows = TableBuilder(OpStat)
        for row in signature_rows(calls, times, inline=inline):  # in OpStat's field order (a test says so)
            rows.add_row(ctx.rank, step, row)
        for table in rows.take():
            ctx.emit(table)

    def _send_spec(self, ctx: AgentContext) -> None:
        self._spec_sent = True
        spec = detect_device_spec(ctx.device, peak_flops=ctx.settings.peak_flops,
                                  peak_bandwidth=ctx.settings.peak_bandwidth)
        ctx.emit(Event(rank=ctx.rank, step=ctx.step, name="device_spec", data=spec.to_dict()))
