"""Where a step ends, and the work done there.

A *step* is one pass over every optimizer that steps in the loop's period: a GAN's
discriminator and generator updates make one step, a WGAN's five critic updates and one
generator update too. The boundary is the post-hook of the period's last optimizer at nesting
depth 0 (ZeroRedundancyOptimizer's inner optimizer does not count). The period is first taken to
be every optimizer the script built (inner optimizers held by another one left out); when an
optimizer steps a second time before the others, the period was shorter: the step is closed
where the last optimizer finished, and the period is learned from it. Nothing is keyed to one
optimizer object, so a remedy that replaces an optimizer keeps steps coming. A loop with no
optimizer at all (a hand-written ``p.data.add_`` update) is cut at the first ``zero_grad``,
top-level forward or batch fetch after a backward (``kind`` says which, see
``docs/architecture.md``).

At a boundary the step's sample is closed (``StepSample``, its probes' figures merged in), the
agent's own work runs (``work``: the stop after ``--steps``, the hold for a decision, the command
relay, the executor, the device's ceilings), and the next step's deep probes start, or its light
block timing.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from advisor.agent.block_timer import BlockTimer, DeviceTimes, timing_event
from advisor.agent.checkpoint_trial import CheckpointTrials
from advisor.agent.clock import PHASE_KEYS, Snapshot, StepClock
from advisor.agent.deep import DeepSchedule
from advisor.agent.objects import ScriptObjects
from advisor.agent.outbox import Outbox
from advisor.agent.period import OptimizerPeriod
from advisor.agent.probeset import ProbeSet
from advisor.apply import registry
from advisor.probes.module_events import ModuleEvents
from advisor.records.samples import StepSample

# What the user is told when steps are found by something else than an optimizer step.
BOUNDARY_TEXT = {
    "optimizer": "steps end after the last optimizer of the loop's period steps",
    "update": "no optimizer stepped: steps end after the parameters' in-place update that follows backward()",
    "zero_grad": "no optimizer stepped: steps end at the zero_grad() after a backward()",
    "forward": "no optimizer stepped: steps end at the first top-level forward after a backward()",
    "data": "no optimizer stepped: steps end at the first batch fetched after a backward()",
    "exit": "no optimizer stepped and no later event: the only step ends at its last backward()",
}


class Boundaries:
    """Finds step boundaries and closes steps there."""

    def __init__(self, *, clock: StepClock, objects: ScriptObjects, probes: ProbeSet, deep: DeepSchedule,
                 outbox: Outbox, module_events: ModuleEvents, work: Callable[[int], bool],
                 closed: Callable[[StepSample], None], quiet: Callable[[], Any] | None = None,
                 trial_wanted: Callable[[], bool] = lambda: False) -> None:
        self._clock, self._objects, self._probes, self._deep = clock, objects, probes, deep
        self._outbox, self._module_events = outbox, module_events
        self._work = work  # the agent's work at the boundary starting a step; False: training stops here
        self._closed = closed  # each step's sample, as it closes
        self._quiet = quiet  # the agent's hooks off and the probes aside, for its own work between steps
        self._trial_wanted = trial_wanted  # whether checkpointing may be offered: its cost is measured
        self.trials = CheckpointTrials()
        self.kind: str | None = None  # "optimizer", "update", "zero_grad", "forward", "data", "exit"
        self.optimizer_mode = False  # some optimizer stepped: steps end at optimizer steps
        self._period = OptimizerPeriod()
        self._snapshot: Snapshot | None = None
        self._checked: dict[str, dict[str, str]] | None = None  # the remedy checks' answers last sent
        self._versions: int | None = None  # parameter versions after the last backward
        self._update_seen = False  # a no-optimizer loop updates through version-visible ops
        self.timer = BlockTimer(counting=lambda: clock.phase != "eval")
        self._last_deep = False  # the step closed last was deep: the next light one is not block-timed
        self._probed = False  # the step just closed was a deep step whose probes ran
        # CUDA: a timing event where the open step began (after the advisor's own boundary work),
        # paired with one at its end: the step's time on the device's timeline (device_time_s).
        self._start_event: Any = None

    # -- what the agent's hooks report ---------------------------------------------------
    def optimizer_starts(self, optimizer: Any) -> None:
        """The outermost ``step()`` of ``optimizer`` begins: a repeat closes the step before it."""
        if not self.optimizer_mode:
            self.optimizer_mode = True
            self._snapshot = None
            self._period.start(self._objects.optimizers())
            self._set_kind("optimizer")
        if self._period.is_repeat(optimizer):
            self._close_at_snapshot("optimizer", learn=True)

    def optimizer_ends(self, optimizer: Any, now: float) -> bool:
        """The outermost ``step()`` of ``optimizer`` ended at ``now``; whether that ended the step."""
        complete = self._period.stepped(optimizer)
        if complete:  # closed here: no snapshot to close it at later (``_close_step`` drops it)
            self._boundary("optimizer", now)
        else:
            self._snapshot = self._clock.snapshot(now)
        return complete

    def backward_ends(self) -> None:
        if not self.optimizer_mode:
            self._versions = self._objects.parameter_versions()
            self._snapshot = self._clock.snapshot(time.perf_counter())

    def fallback(self, event: str) -> None:
        """In a loop without optimizer steps, a step ends at the first zero_grad, training
        forward or batch fetch after a backward (after the update, when updates are visible).
        The caller checks that no optimizer step and no backward is under way."""
        if self.optimizer_mode or self._snapshot is None:
            return  # the snapshot is taken at each backward's end: none means no backward yet
        if self._objects.optimizers():
            return  # an optimizer exists: its first step will end this step
        versions = self._objects.parameter_versions()
        if self._versions is not None and versions != self._versions:
            self._update_seen = True
            kind = "update"
        elif self._update_seen:
            return  # accumulating gradients: the update has not come yet
        else:
            kind = event
        self._set_kind(kind)
        self._boundary(kind, time.perf_counter())

    def close_at_exit(self) -> None:
        """At exit: close a loop's last step without optimizer (an optimizer that never stepped: no step ended)."""
        if not self.optimizer_mode and self._snapshot is not None and not self._objects.optimizers():
            self._set_kind(self.kind or "exit")
            self._close_at_snapshot("exit", learn=False)

    def stop_timing(self) -> None:
        """End a light step's block timing cut short (at exit, or when the hooks are uninstalled):
        its saved-tensor hooks must not outlive the agent on autograd's stack."""
        if self.timer.active:
            self.timer.stop()
        self.trials.stop()

    # -- closing steps -------------------------------------------------------------------
    def _set_kind(self, kind: str) -> None:
        if kind == self.kind:
            return
        self.kind = kind
        self._outbox.event("step_boundary", {"kind": kind, "message": BOUNDARY_TEXT[kind]})
        if kind != "optimizer":  # the user is told how a loop without optimizer was cut into steps
            self._outbox.warn(BOUNDARY_TEXT[kind], boundary=kind)

    def _close_at_snapshot(self, kind: str, *, learn: bool) -> None:
        """The step ended at the last snapshot: close it there, and carry what ran since
        into the next step (an optimizer that stepped twice, or the end of the script)."""
        snap = self._snapshot
        if snap is None:
            return
        carry = self._clock.rewind(snap)
        if learn:
            self._period.learn_from_stepped()
            labels = [self._objects.optimizer_label(o) for o in self._objects.optimizers()
                      if self._period.is_repeat(o)]
            self._outbox.event("step_period", {"optimizers": labels})
        was_deep = self._deep.active
        self._close_step(snap.time, kind)
        self._clock.resume(carry)
        if not learn:
            return
        self._deep.postpone(self._clock.step, was_deep=was_deep)
        self._after_boundary(deep=False)

    def _boundary(self, kind: str, now: float) -> None:
        clock = self._clock
        clock.flush(now)
        self._close_step(now, kind, on_device=True)
        clock.phase = "data"
        self._after_boundary(deep=True)
        if self._probed:
            # The deep probes' records go out now, not beside the next step (``AgentChannel.drain``).
            self._outbox.drain()
        # The advisor's own work at this boundary (the deep probes' teardown and set-up, the
        # one-off device micro-benchmark, an apply) is not the next step's data wait.
        clock.restart(time.perf_counter())
        self._start_event = self._device_mark()

    def _device_mark(self) -> Any:
        """A timing event recorded now on the job device's current CUDA stream, or None off CUDA."""
        device = self._objects.device
        return timing_event(device) if device.type == "cuda" else None

    def _close_step(self, end: float, kind: str, *, on_device: bool = False) -> None:
        """Emit the open step, which ended at ``end`` (its accounting is flushed to ``end``).
        ``on_device``: the step ends now (a boundary hook), so a CUDA event recorded here ends
        it on the device's timeline too; a step closed later, at a snapshot, gets no device time."""
        clock = self._clock
        step = clock.step
        start_event, self._start_event = self._start_event, None
        step_events = (start_event, self._device_mark()) if on_device and start_event is not None else None
        deep = self._deep.active
        self._last_deep = deep
        deep_probes = self._deep.stop(step)
        self._probed = bool(deep_probes)  # a deep step that ran probes: many records to send
        extra: dict[str, Any] = {}
        for figures in self._probes.call_all("on_step_end", step):
            extra.update(figures or {})
        module_times = self.timer.stop() if self.timer.active else ({}, {})
        if self._quiet is not None:
            trials = self.trials.finish(self._quiet, self._objects.device)
            if trials:
                self._outbox.event("checkpoint_trial", {"modules": trials}, step=step)
        module_forward_s, module_recompute_s = ({}, {}) if isinstance(module_times, DeviceTimes) else module_times
        eval_s = clock.acc.get("eval", 0.0)
        sample = StepSample(
            index=step,
            rank=self._outbox.rank,
            end_time=time.time(),
            time_s=end - clock.step_start - eval_s,
            loss=None,
            micro_batches=len(clock.losses),
            phases={PHASE_KEYS[k]: v for k, v in clock.acc.items() if k != "eval"},
            peak_memory_bytes=extra.get("peak_memory_bytes"),
            deep=deep,
            eval_s=eval_s,
            boundary=kind,
            optimizer_s=dict(clock.opt_times),
            module_forward_s=module_forward_s,
            module_recompute_s=module_recompute_s,
            deep_probes=deep_probes,
        )
        self._outbox.queue_sample(sample, clock.losses,
                                  module_times if isinstance(module_times, DeviceTimes) else None, step_events)
        self._snapshot = None
        self._period.reset()
        self._closed(sample)
        self._deep.bound_cost(sample)
        clock.next_step(end)

    def _check_remedies(self, step: int) -> None:
        """Ask every remedy whether it can apply to this job (``check_<name>``, advisor/apply/registry.py)
        once the script's objects are known (the boundary before step 1) and at each deep step (an
        apply may have changed the job), and send the answers when they changed: the recommender
        offers nothing they refuse."""
        answers = registry.checks(self._objects.target())
        if answers != self._checked:
            self._checked = answers
            self._outbox.event("remedy_checks", {"checks": answers}, step=step)

    def _after_boundary(self, *, deep: bool) -> None:
        step = self._clock.step
        if not self._work(step):
            return
        started = deep and self._deep.start(step)
        if step == 1 or started:
            self._check_remedies(step)
        if deep and not started and self._deep.light_timing_due(step, after_deep=self._last_deep):
            blocks = self._objects.numbered_modules()
            if blocks:
                self.timer.start(blocks, self._module_events.subscribe, device=self._objects.device)
                if self._quiet is not None and self._trial_wanted():
                    self.trials.start(blocks)
        self._outbox.flush(sync=False)
