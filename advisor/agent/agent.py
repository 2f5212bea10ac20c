"""The agent: its life in the training process, and the phases of each step.

The global hooks (``advisor/agent/hooks.py``) call the agent's callbacks; the agent keeps the
phase of the step in progress and hands the rest to its parts, one job each:

- ``StepClock`` (clock.py): the step in progress and what each phase took;
- ``Boundaries`` (boundary.py): where a step ends, and the work done there;
- ``ScriptObjects`` (objects.py): the script's models, optimizers and captured objects;
- ``DeepSchedule`` (deep.py): which steps the probes deep-sample;
- ``Outbox`` (outbox.py): the records on their way to the controller;
- ``ApplyHold`` (hold.py): the wait for the controller's decision on an apply;
- ``ProbeSet`` (probeset.py): calling the probes, disabling one that fails;
- ``AgentView`` (view.py): the one object probes, plans and the executor see.

None of them knows the agent. A step's time runs from the previous boundary to this one, less
its ``eval`` time, and is split into phases that add up to it exactly:

- ``data``: before the step's first forward, plus time inside
  ``DataLoader.__next__`` anywhere in the step (loading, and anything the loop
  does before its first forward: host-to-device copies, logging);
- ``forward``: from a root module's forward to ``backward()`` (the loss
  computation outside modules is included), also inside a closure optimizer's ``step``;
- ``backward``: inside ``torch.autograd.backward``;
- ``optimizer``: inside the optimizers' ``step`` (less the closure's forward and backward);
- ``other``: the rest (e.g. between backward and the optimizer step).

A top-level forward under ``no_grad`` outside the training forward is ``eval``: kept in
``StepSample.eval_s``, out of ``time_s``.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from typing import Any, Callable, Iterator

import torch

from advisor.agent.boundary import Boundaries
from advisor.agent.clock import StepClock
from advisor.agent.deep import DeepSchedule
from advisor.agent.device_spec import send_device_spec
from advisor.agent.hold import ApplyHold
from advisor.agent.objects import ScriptObjects
from advisor.agent.outbox import Outbox
from advisor.agent.probeset import ProbeSet
from advisor.agent.relay import CommandRelay
from advisor.agent.view import AgentView
from advisor.apply.executor import Executor
from advisor.apply.plan import apply_plan_before_first_step, load_plan
from advisor.probes.module_events import ModuleEvents
from advisor.probes.probe import Probe
from advisor.records.commands import RELEASE, command_from_dict
from advisor.records.samples import Record, StepSample
from advisor.records.settings import AgentSettings


class StopTraining(BaseException):
    """Raised from the optimizer hook to end the script cleanly after ``--steps N``.

    A ``BaseException`` so that a script's ``except Exception`` does not swallow it.
    """


class Agent:
    """Hook callbacks, and the parts they drive; one per training process."""

    def __init__(self, *, emit: Callable[[Record], None], settings: AgentSettings | None = None,
                 probes: list[Probe] | None = None, rank: int = 0, world_size: int = 1,
                 drain: Callable[[], object] | None = None) -> None:
        self.settings = settings = settings if settings is not None else AgentSettings()
        self.rank, self.world_size = rank, world_size
        self.clock = clock = StepClock()
        self.outbox = outbox = Outbox(emit, rank=rank, step=lambda: clock.step, drain=drain)
        self.objects = ScriptObjects(outbox, rank=rank, world_size=world_size, comm_switch=settings.comm_switch)
        self.probes = ProbeSet(list(probes or []), warn=outbox.warn, passes=(StopTraining,))
        self.deep = DeepSchedule(settings, self.probes, outbox, step=lambda: clock.step)
        self.hold = ApplyHold(at_step=settings.apply_hold_step, wait_s=settings.apply_hold_s, outbox=outbox,
                              step=lambda: clock.step)
        self.module_events = ModuleEvents()  # probes' module hooks, fanned out from the agent's one pair
        # Several controllers (a multi-node job): rank 0's commands reach every rank at boundaries.
        self.relay: CommandRelay | None = None
        multinode = settings.multinode
        if multinode is not None and multinode.relay:
            self.relay = CommandRelay(rank=rank, local_rank=env_rank()[1], world_size=world_size, settings=multinode,
                                      deliver=self._run_command, emit=outbox.event)
        self.context = AgentView(settings=settings, clock=clock, objects=self.objects, deep=self.deep,
                                 outbox=outbox, hold=self.hold, module_events=self.module_events,
                                 relayed=self.relay is not None)
        self.probes.context = self.context
        self.boundaries = Boundaries(clock=clock, objects=self.objects, probes=self.probes, deep=self.deep,
                                     outbox=outbox, module_events=self.module_events, work=self._boundary_work,
                                     closed=self._step_closed, quiet=self._quiet,
                                     trial_wanted=lambda: settings.memory_budget_bytes is not None)
        self.executor: Executor | None = None  # created at the first command (or plan)
        self.max_steps = settings.max_steps
        # The device's ceilings are measured once, for the compute probe's roofline.
        self._spec_due = "compute" in self.probes.names()
        self._opt_depth = 0
        self._opt_t0 = 0.0
        self._closure_backwards = 0
        self._fwd_depth = 0
        self._eval_iters: weakref.WeakSet = weakref.WeakSet()  # DataLoader iterators of eval passes
        self._last_fetch: weakref.ref | None = None
        self._scaled_loss: tuple[weakref.ref, torch.Tensor] | None = None  # (scale(loss), loss)
        self._stop_pending = False
        self.disabled = False
        self.interrupt_pending = False  # a Ctrl-C swallowed where Python ignores exceptions
        # The module hooks lifted for the agent's own forwards (``hooks.install`` sets it: ForwardHooks.aside).
        self.hooks_aside: Callable[[], contextlib.AbstractContextManager] | None = None

    @property
    def step(self) -> int:
        """Index of the step in progress."""
        return self.clock.step

    def install(self, add_undo: Callable[[Callable[[], None]], None]) -> None:
        """Capture the script's objects as it builds them (``hooks.install`` calls this)."""
        self.objects.install(add_undo, step=lambda: self.clock.step, on_optimizer=self.optimizer_created)

    def attach_probes(self) -> None:
        self.probes.call_all("attach")

    def flush(self, *, sync: bool) -> None:
        """Emit queued step samples whose loss is readable (all of them if ``sync``)."""
        self.outbox.flush(sync=sync)

    # -- commands from the controller (called on the channel's reader thread) ---------
    def submit_command(self, command: dict[str, Any]) -> None:
        kind = command.get("type")
        try:
            if kind == RELEASE:
                return
            if self.relay is not None:  # every rank gets it from rank 0 at the next boundary
                self.relay.submit(command)
                return
            self._run_command(command)
        finally:
            if kind in ("apply", RELEASE):
                self.hold.decided()  # once the apply is queued

    def _run_command(self, command: dict[str, Any]) -> None:
        kind = command.get("type")
        if kind == "stop":
            # Stop cleanly at the next boundary, like --steps.
            self.max_steps = self.clock.step + 1
            return
        if kind in ("apply", "revert"):
            self._ensure_executor().submit(command_from_dict(command))  # typed; ValueError if malformed

    def _ensure_executor(self) -> Executor:
        if self.executor is None:
            self.executor = Executor(self.context)
        return self.executor

    def load_plan(self, path: str | None) -> None:
        """Apply a plan file's remedies at the first forward of the model (``--plan``)."""
        if not path:
            return
        plan = load_plan(path)
        self.objects.on_first_forward(lambda model: apply_plan_before_first_step(
            self.context, plan, model=model, executor=self._ensure_executor()))

    # -- step boundaries: the agent's own work --------------------------------------------
    def _boundary_work(self, step: int) -> bool:
        """At the boundary that starts ``step``; False when training stops here (``--steps``)."""
        if self.max_steps is not None and step >= self.max_steps:
            # Stop at the next step's first training event, not here: the rest of this loop
            # iteration (the script's logging, scheduler, checkpoint saving) still runs.
            self.outbox.flush(sync=True)
            self._stop_pending = True
            return False
        # In a multi-node job rank 0 alone waits; the others wait for it in the relay's exchange.
        self.hold.wait_if_due(waits=self.relay is None or self.rank == 0,
                              flush=lambda: self.outbox.flush(sync=True))
        if self.relay is not None:
            self.relay.exchange(step)
        if self.executor is not None:
            self.executor.on_boundary(step)
        if self._spec_due:  # after step 0, before any deep probe starts
            self._spec_due = False
            send_device_spec(self.objects.device, self.settings, self.outbox)
        return True

    def _step_closed(self, sample: StepSample) -> None:
        if self.executor is not None:
            self.executor.on_step_end(sample)

    # -- phases ----------------------------------------------------------------------
    def _check_interrupt(self) -> None:
        if self.interrupt_pending:  # see bootstrap: a Ctrl-C that landed in a finalizer
            self.interrupt_pending = False
            raise KeyboardInterrupt

    def _stop_if_due(self) -> None:
        """Raise ``StopTraining`` at the first training event after the last requested step.

        Training events only (a forward with grad, a backward, an optimizer step): the rest of
        the last iteration, a final evaluation pass, logging and checkpoint saving still run.
        """
        if self._stop_pending:
            self._stop_pending = False
            self.disabled = True  # no more records after the last requested step
            raise StopTraining(f"stopped after {self.clock.step} steps (--steps)")

    def _set_phase(self, phase: str) -> None:
        now = time.perf_counter()
        self.clock.switch(phase, now)
        self.probes.on_phase(phase, now)

    def _idle_phase(self) -> str:
        """Between events: inside a closure optimizer's step it is still the optimizer's time."""
        return "optimizer" if self._opt_depth > 0 else "other"

    def _fallback_boundary(self, event: str) -> None:
        if not self._opt_depth and not self.clock.in_backward():
            self.boundaries.fallback(event)

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """The agent's own forward and backward between steps (a checkpoint trial's copy): its
        hooks see nothing, and every probe with a ``quiet`` context steps aside."""
        was, self.disabled = self.disabled, True
        try:
            with contextlib.ExitStack() as stack:
                if self.hooks_aside is not None:  # the module hooks off: the copy runs as a light step does
                    stack.enter_context(self.hooks_aside())
                for probe in self.probes:
                    quiet = getattr(probe, "quiet", None)
                    if callable(quiet):
                        stack.enter_context(quiet(self.context))
                yield
        finally:
            self.disabled = was

    # -- hook callbacks --------------------------------------------------------------
    def forward_pre(self, module: torch.nn.Module) -> bool:
        """A module's forward starts; True when it is a top-level forward (the agent's hooks may
        then lift the per-module hooks for its length, ``advisor/agent/forward_hooks.py``)."""
        if self.disabled or torch._C._current_graph_task_id() != -1:
            return False  # recomputation under checkpointing runs forwards inside backward
        self._fwd_depth += 1
        if self._fwd_depth != 1:
            return False
        self._check_interrupt()
        training = torch.is_grad_enabled()
        if training:
            self._fallback_boundary("forward")
            self._stop_if_due()
        self.objects.see(module)
        phase = self.clock.phase
        if training:
            if phase in ("data", "other", "eval", "optimizer"):
                self._set_phase("forward")  # inside optimizer.step: a closure's forward
        elif phase in ("data", "other"):
            # A forward under no_grad outside the training forward: an evaluation pass.
            fetched = self._last_fetch() if self._last_fetch is not None else None
            if fetched is not None and phase == "data":
                self._eval_iters.add(fetched)  # its next batches are eval time too
            self._set_phase("eval")
        return True

    def forward_post(self, module: torch.nn.Module) -> None:
        if self.disabled or torch._C._current_graph_task_id() != -1:
            return
        if self._fwd_depth > 0:
            self._fwd_depth -= 1

    def backward_start(self, tensors: Any) -> None:
        if self.disabled:
            return
        self._check_interrupt()
        self._stop_if_due()
        self._fwd_depth = 0  # a forward that raised never ran its post-hook
        pending, self._scaled_loss = self._scaled_loss, None
        loss = pending[1] if pending is not None and pending[0]() is tensors else tensors
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            # A closure optimizer (LBFGS) evaluates the loss several times in one step; the
            # step's objective is its first evaluation (what ``step`` returns), the rest are
            # kept in ``losses`` only.
            counted = not (self._opt_depth > 0 and self._closure_backwards > 0)
            self.clock.losses.append((loss.detach(), counted))
        if self._opt_depth > 0:
            self._closure_backwards += 1
        self._set_phase("backward")

    def loss_scaled(self, scaled: Any, loss: Any) -> None:
        """``GradScaler.scale(loss)`` returned ``scaled``; a backward on it records ``loss``."""
        if not self.disabled and isinstance(scaled, torch.Tensor) and isinstance(loss, torch.Tensor):
            self._scaled_loss = (weakref.ref(scaled), loss.detach())

    def backward_end(self) -> None:
        if self.disabled:
            return
        self._set_phase(self._idle_phase())
        self.objects.confirm(by_grad=True)
        self.boundaries.backward_ends()

    def zero_grad_called(self) -> None:
        """``Module.zero_grad`` or ``Optimizer.zero_grad``: a step boundary in a loop without optimizer steps."""
        if not self.disabled:
            self._check_interrupt()
            self._fallback_boundary("zero_grad")

    def data_start(self, iterator: Any = None) -> str:
        previous = self.clock.phase
        if self.disabled:
            return previous
        self._check_interrupt()
        self._fallback_boundary("data")
        previous = self.clock.phase
        if iterator is not None:
            self._last_fetch = weakref.ref(iterator)
        if previous == "eval" and iterator is not None and iterator in self._eval_iters:
            return previous  # the next batch of an evaluation pass
        if previous != "data":
            self._set_phase("data")
        return "data" if previous == "eval" else previous

    def data_end(self, previous: str) -> None:
        if not self.disabled and previous != self.clock.phase:
            self._set_phase(previous)

    def optimizer_created(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.disabled:
            self.objects.optimizer_created(optimizer)

    def optimizer_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if self.disabled:
            return
        self._check_interrupt()
        self.optimizer_created(optimizer)
        if self._opt_depth == 0:
            self.boundaries.optimizer_starts(optimizer)
            self._stop_if_due()
            self.objects.confirm(optimizer=optimizer)
            self._closure_backwards = 0
            self._opt_t0 = time.perf_counter()
        self._opt_depth += 1
        if self._opt_depth == 1:
            self._set_phase("optimizer")

    def optimizer_post(self, optimizer: torch.optim.Optimizer) -> None:
        if self.disabled:
            return
        self._opt_depth = max(0, self._opt_depth - 1)
        if self._opt_depth != 0:
            return
        now = time.perf_counter()
        self.clock.add_optimizer_time(self.objects.optimizer_label(optimizer), now - self._opt_t0)
        if not self.boundaries.optimizer_ends(optimizer, now):
            self._set_phase("other")

    # -- the end ---------------------------------------------------------------------
    def close(self) -> None:
        """At exit: close a loop's last step without optimizer, emit what is pending, stop probes."""
        if not self.disabled:
            self.boundaries.close_at_exit()
        self.boundaries.stop_timing()
        self.outbox.flush(sync=True)
        if self.executor is not None:
            self.executor.close()  # reports a measurement window cut short by the exit
        self.probes.call_all("detach", reverse=True)
        self.deep.warn_if_none_ran(self.clock.step)
        self.deep.gc_pace.restore()  # the collector at the script's pace, whatever step it ended in
        self.disabled = True


def env_rank() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) otherwise."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))
