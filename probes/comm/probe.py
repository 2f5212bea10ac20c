"""``CommProbe``: per-call collective records with exposed time, on every rank.

Light path (every step): the dispatcher-level interceptor (``advisor.probes.comm.intercept``)
stamps each call's issue and completion (wall clock ``time.time()``, seconds), bytes per
nccl-tests conventions, dtype and a per-group sequence number. At each step end the probe
emits one ``CollectiveStat`` per completed call, plus one ``Event("collective_seq")``
carrying each call's (op, group, seq, start) so the controller can match calls across
ranks and fill ``wait_s`` (``CollectiveStat`` has no ``seq``/``group`` field yet).

Exposed time (CPU, gloo): the part of a call's [start, end] when the issuing rank's main
thread does no compute. Compute intervals are the forward, backward and optimizer phases
minus the intervals in which the main thread is known to be blocked on communication:
Python-level ``Work.wait()`` calls (every synchronous ``torch.distributed`` call waits this
way) and the end of each backward that issued collectives, from the moment autograd ran
out of gradient work (an engine callback queued at the first collective of that backward,
which therefore runs before DDP's finalize wait) to the end of the backward phase. Waits
that C++ issues in the middle of backward (FSDP2's root post-backward callback, queued
before ours) count as compute, so exposure there is a lower bound.

Until the first call the probe only follows the phase under way (its name and start): a job
that issues no collective pays no polling, booking or flushing on its light steps.

Exposed time (CUDA): on deep-sampled steps, the NCCL kernel's device interval not
covered by any other kernel, from the profiler; light steps reuse the latest deep figure
for the same (op, bytes, group size, dtype), scaled as a fraction of the call's time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from advisor.probes.comm.cuda_timing import kernel_times
from advisor.probes.comm.intercept import CallRecord, CollectiveInterceptor
from advisor.probes.fork_guard import guard_forks
from advisor.probes.probe import AgentContext, Probe
from advisor.records.events import CollectiveCall, CollectiveSeq
from advisor.records.samples import CollectiveStat
from advisor.records.intervals import exposed_s, merge_intervals, subtract_intervals

SETTLE_S = 2.0  # at detach, how long the last step's collectives may take to report their end

COMPUTE_PHASES = frozenset({"forward", "backward", "optimizer"})
MAX_PENDING_STEPS = 8  # a call still incomplete this many steps later is dropped


class CommProbe(Probe):
    """Collectives and point-to-point calls: bytes, time, exposed time, sequence numbers."""

    name = "comm"

    def __init__(self) -> None:
        self.interceptor: CollectiveInterceptor | None = None
        self._ctx: AgentContext | None = None
        self._offset = 0.0  # time.time() - time.perf_counter()
        self._phase = "data"
        self._phase_start = 0.0
        self._compute: list[tuple[float, float]] = []
        self._blocked: list[tuple[float, float]] = []
        self._bw_marks: list[float] = []
        self._marked_tasks: set[int] = set()
        self._pending: list[tuple[int, CallRecord]] = []  # (step issued, call)
        self._lock = threading.Lock()
        self._deep_step: int | None = None
        self._profiler: Any = None
        self._cuda_estimates: dict[tuple[str, int, int, str], tuple[float, float]] = {}
        # No collective issued yet (every step of a one-process job): the phases are followed, not
        # booked as intervals, and nothing is polled or flushed (40 us a light step, 2026-11-29).
        self._quiet_so_far = True

    # ------------------------------------------------------------------ agent hooks
    def attach(self, ctx: AgentContext) -> None:
        if not torch.distributed.is_available():
            return
        self._ctx = ctx
        self._offset = time.time() - time.perf_counter()
        self._phase = ctx.phase
        self._phase_start = time.time()
        self.interceptor = CollectiveInterceptor(on_call=self._on_call)
        self.interceptor.install()

    def detach(self, ctx: AgentContext) -> None:
        if self._profiler is not None:
            self._stop_profiler()
        if self._ctx is not None:
            self._settle()
            self._flush(ctx, time.time(), final=True)
        if self.interceptor is not None:
            self.interceptor.uninstall()
            self.interceptor = None

    def on_phase(self, ctx: AgentContext, phase: str, now: float) -> None:
        wall = now + self._offset
        if self._quiet_so_far:  # the phase under way is known when a first call comes: its start suffices
            self._phase, self._phase_start = phase, wall
            return
        if self.interceptor is not None:
            self.interceptor.poll(time.time())
        self._close_phase(wall)
        self._phase, self._phase_start = phase, wall

    def start_deep(self, ctx: AgentContext, step: int) -> None:
        self._deep_step = step
        # ``advisor fit``'s CUDA is a fake one: no kernels to profile.
        if ctx.device.type == "cuda" and torch.cuda.is_available() and self._profiler is None and ctx.settings.fit is None:
            if torch.autograd.profiler._is_profiler_enabled:  # another probe's profiler owns the step
                return
            # Only a job with a process group issues collectives: profiling kernels without one
            # pairs nothing, and on an H100 (torch 2.11) the kineto session it opened beside
            # the compute probe's op counter crashed the training process in ``events()``.
            if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
                return
            from torch.profiler import ProfilerActivity, profile

            self._profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self._profiler.__enter__()
            guard_forks()  # kineto's loader thread now exists: keep it out of forked children

    def stop_deep(self, ctx: AgentContext, step: int) -> None:
        if self._profiler is not None:
            kernels = self._stop_profiler()
            with self._lock:
                deep_calls = [c for s, c in self._pending if c.device == "cuda" and c.extra.get("deep")]
            # NCCL kernels run in issue order on their stream; pair them with calls in order.
            for call, kernel in zip(sorted(deep_calls, key=lambda c: c.start), kernels):
                call.extra["kernel_time_s"] = kernel.time_s
                call.extra["kernel_exposed_s"] = kernel.exposed_s
                key = (call.op, call.bytes, call.group_size, call.dtype)
                ratio = kernel.exposed_s / kernel.time_s if kernel.time_s > 0 else 0.0
                self._cuda_estimates[key] = (kernel.time_s, ratio)
            for call in deep_calls:
                call.extra["deep"] = False
        self._deep_step = None
        self._flush(ctx, time.time(), final=False)

    def on_step_end(self, ctx: AgentContext, step: int) -> dict[str, Any]:
        wall = time.perf_counter() + self._offset
        if self._quiet_so_far:
            self._phase_start = wall
            return {}
        if self.interceptor is not None:
            self.interceptor.poll(time.time())
        self._close_phase(wall)
        self._phase_start = wall
        self._flush(ctx, wall, final=False)
        return {}

    # ------------------------------------------------------------------ internals
    def _settle(self, timeout_s: float = SETTLE_S) -> None:
        """Before the final flush: the last step's works report their end from the backend's
        thread (future callbacks) or at a poll, which may not have happened yet; without waiting
        the final flush would drop them. Bounded: it never holds the exit longer than
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.interceptor is not None:
                self.interceptor.poll(time.time())
            with self._lock:
                waiting = any(c.end is None and c.device != "cuda" for _, c in self._pending)
            if not waiting or time.monotonic() >= deadline:
                return
            time.sleep(0.005)

    def _on_call(self, call: CallRecord) -> None:
        # From here on every phase is booked. A first call on another thread than the training
        # one, in the instant that thread switches phase, could leave the phase before it unbooked:
        # that call's exposed time then reads high; the calls after it are unaffected.
        self._quiet_so_far = False
        ctx = self._ctx
        step = ctx.step if ctx is not None else 0
        if self._deep_step is not None and self._profiler is not None:
            call.extra["deep"] = True
        with self._lock:
            self._pending.append((step, call))
        if call.in_backward:
            task = torch._C._current_graph_task_id()
            if task not in self._marked_tasks:
                self._marked_tasks.add(task)
                # Runs when autograd has no gradient work left, before callbacks queued later
                # (DDP's finalize, which waits for the buckets).
                torch.autograd.Variable._execution_engine.queue_callback(
                    lambda: self._bw_marks.append(time.time())
                )

    def _close_phase(self, wall: float) -> None:
        if self._phase in COMPUTE_PHASES and wall > self._phase_start:
            self._compute.append((self._phase_start, wall))
        if self._phase == "backward":
            for mark in self._bw_marks:
                if self._phase_start <= mark <= wall:
                    self._blocked.append((mark, wall))
            self._bw_marks.clear()
            self._marked_tasks.clear()

    def _compute_intervals(self) -> list[tuple[float, float]]:
        blocked = list(self._blocked)
        if self.interceptor is not None:
            self._blocked.extend(self.interceptor.drain_blocked())
            blocked = list(self._blocked)
        return subtract_intervals(self._compute, blocked)

    def _flush(self, ctx: AgentContext, now: float, *, final: bool) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            keep = self._emit_timed(ctx, pending, final=final)
        else:  # no collective since the last flush (every step of a job without any): nothing to time
            keep = []
            if self.interceptor is not None:
                self._blocked.extend(self.interceptor.drain_blocked())
        with self._lock:
            self._pending = keep + self._pending
            oldest = min((c.start for _, c in self._pending), default=now)
        # Intervals ending before every pending call started can no longer matter.
        self._compute = [i for i in self._compute if i[1] >= oldest]
        self._blocked = [i for i in self._blocked if i[1] >= oldest]

    def _emit_timed(self, ctx: AgentContext, pending: list[tuple[int, CallRecord]], *,
                    final: bool) -> list[tuple[int, CallRecord]]:
        """Emit the calls of ``pending`` whose times are known; those still to be kept pending."""
        compute = merge_intervals(self._compute_intervals())
        keep: list[tuple[int, CallRecord]] = []
        seq_rows: dict[int, list[CollectiveCall]] = {}
        for step, call in pending:
            if call.extra.get("deep"):
                keep.append((step, call))
                continue
            time_s, exp_s = self._times(call, compute)
            if time_s is None:
                if not final and ctx.step - step < MAX_PENDING_STEPS:
                    keep.append((step, call))
                continue
            ctx.emit(
                CollectiveStat(
                    rank=ctx.rank,
                    step=step,
                    op=call.op,
                    group_size=call.group_size,
                    group_ranks=None if call.group_ranks is None else list(call.group_ranks),
                    bytes=call.bytes,
                    dtype=call.dtype,
                    count=1,
                    start=call.start,
                    time_s=time_s,
                    exposed_s=exp_s,
                    wait_s=0.0,  # filled controller-side by matching ranks
                )
            )
            seq_rows.setdefault(step, []).append(
                CollectiveCall(op=call.op, group=str(call.group), seq=call.seq, start=call.start))
        for step, rows in seq_rows.items():
            ctx.emit(CollectiveSeq(calls=tuple(rows)).event(rank=ctx.rank, step=step))
        return keep

    def _times(self, call: CallRecord, compute: list[tuple[float, float]]) -> tuple[float | None, float]:
        if call.device == "cuda":
            if "kernel_time_s" in call.extra:
                return call.extra["kernel_time_s"], call.extra["kernel_exposed_s"]
            estimate = self._cuda_estimates.get((call.op, call.bytes, call.group_size, call.dtype))
            if estimate is not None:
                return estimate[0], estimate[0] * estimate[1]
        if call.end is None:
            return None, 0.0
        return call.time_s, exposed_s((call.start, call.end), compute)

    def _stop_profiler(self) -> list:
        prof, self._profiler = self._profiler, None
        try:
            torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            return kernel_times(prof.events())
        except Exception:
            return []
