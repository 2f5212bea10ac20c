"""The agent: discovers models, optimizers, steps and phases in an unmodified script.

A *step* is one pass over every optimizer that steps in the loop's period: a GAN's
discriminator and generator updates make one step, a WGAN's five critic updates and one
generator update too. The boundary is the post-hook of the period's last optimizer at
nesting depth 0 (ZeroRedundancyOptimizer's inner optimizer does not count). The period is
first taken to be every optimizer the script built (inner optimizers held by another one
left out); when an optimizer steps a second time before the others, the period was shorter:
the step is closed where the last optimizer finished, and the period is learned from it.
Nothing is keyed to one optimizer object, so a remedy that replaces an optimizer keeps
steps coming. A loop with no optimizer at all (a hand-written ``p.data.add_`` update) is
cut at the first ``zero_grad``, top-level forward or batch fetch after a backward
(``boundary`` says which, see ``docs/architecture.md``).

A step's time runs from the previous boundary to this one, less its ``eval`` time, and is
split into phases that add up to it exactly:

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

The agent is also the ``AgentContext`` that probes and the apply executor see.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from advisor.agent.block_timer import BlockTimer, DeviceTimes, numbered, timing_event
from advisor.agent.capture import Capture
from advisor.agent.models import ModelRegistry
from advisor.agent.naming import unique_label
from advisor.records.schedule import DEEP_STEPS, LIGHT_TIMING_EVERY, light_timing_due
from advisor.agent.period import OptimizerPeriod
from advisor.agent.relay import CommandRelay
from advisor.apply.executor import HISTORY as EXECUTOR_HISTORY, Executor
from advisor.apply.plan import apply_plan_before_first_step, load_plan
from advisor.apply.target import Target, unwrap  # noqa: F401  (unwrap: re-exported)
from advisor.probes.device.hostlink import host_link
from advisor.probes.device.spec import detect_device_spec
from advisor.probes.module_events import ModuleEvents
from advisor.probes.probe import Probe
from advisor.records.commands import RELEASE, command_from_dict
from advisor.records.samples import Event, ModelInfo, OptimizerInfo, Record, StepSample

log = logging.getLogger("advisor.agent")

HOLD_S = 60.0  # the longest the job waits for the controller's decision on an apply at a step asked for
_PHASE_KEYS = {"data": "data_s", "forward": "forward_s", "backward": "backward_s",
               "optimizer": "optimizer_s", "other": "other_s", "eval": "eval_s"}

# What the user is told when steps are found by something else than an optimizer step.
_BOUNDARY_TEXT = {
    "optimizer": "steps end after the last optimizer of the loop's period steps",
    "update": "no optimizer stepped: steps end after the parameters' in-place update that follows backward()",
    "zero_grad": "no optimizer stepped: steps end at the zero_grad() after a backward()",
    "forward": "no optimizer stepped: steps end at the first top-level forward after a backward()",
    "data": "no optimizer stepped: steps end at the first batch fetched after a backward()",
    "exit": "no optimizer stepped and no later event: the only step ends at its last backward()",
}


class StopTraining(BaseException):
    """Raised from the optimizer hook to end the script cleanly after ``--steps N``.

    A ``BaseException`` so that a script's ``except Exception`` does not swallow it.
    """






@dataclass
class _Snapshot:
    """The open step's accounting at one instant (the end of an optimizer step, or of a
    backward in a loop without an optimizer), so that a step found to have ended there
    can be closed after the fact."""

    time: float
    acc: dict[str, float]
    n_losses: int
    opt_times: dict[str, float]


class Agent:
    """Hook callbacks plus the state they share; one per training process."""

    def __init__(
        self,
        *,
        emit: Callable[[Record], None],
        config: dict[str, Any] | None = None,
        probes: list[Probe] | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self._emit_fn = emit
        self.config: dict[str, Any] = dict(config or {})
        self.probes: list[Probe] = list(probes or [])
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device("cpu")
        self.executor: Any = None  # advisor.apply.executor.Executor, created on first command
        # The last steps' samples (loss not read yet), for the executor's before window when it
        # is created after them.
        self.recent_steps: deque[StepSample] = deque(maxlen=EXECUTOR_HISTORY)
        # CUDA: the recent steps' device_time_s by index, as flush resolves them (device_step_times).
        self._device_times: dict[int, float] = {}
        self.capture = Capture()  # what the script built, for remedies (installed by hooks.install)
        self.module_events = ModuleEvents()  # probes' module hooks, fanned out from the agent's one pair
        # One light step in this many (steps every-1, 2*every-1, ...) times its numbered modules'
        # forward (advisor/agent/block_timer.py): the recompute cost of checkpointing them. 0: never.
        self.light_timing_every = int(self.config.get("light_timing_every", LIGHT_TIMING_EVERY) or 0)
        self._block_timer = BlockTimer(counting=lambda: self._phase != "eval")
        self.max_steps: int | None = self.config.get("max_steps")
        # ``--apply X --apply-at-step K``: wait at the boundary before step K for the controller's
        # decision (an apply command for K, or a release), at most ``apply_hold_s``.
        self._hold_step: int | None = self.config.get("apply_hold_step")
        self._hold_s = float(self.config.get("apply_hold_s", HOLD_S))
        self._decision = threading.Event()
        self.holding = False  # waiting at the boundary before the step an apply was asked for
        self.deep_steps: set[int] = set(self.config.get("deep_steps", DEEP_STEPS))
        self.deep_every: int = int(self.config.get("deep_every", 0) or 0)
        # A deep step slower than this many light steps (and than deep_min_s) ends deep sampling.
        self.deep_max_slowdown = float(self.config.get("deep_max_slowdown", 20.0))
        self.deep_min_s = float(self.config.get("deep_min_s", 30.0))
        self._deep_extra = 0
        self._deep_active = False
        self._deep_running: list[Probe] = []  # the probes deep-sampling the step in progress
        self._solo_extra, self._solo_names = 0, frozenset[str]()  # steps asked for by solo probes
        self._solo_ran = False  # the solo probes had their step in this run of deep steps
        self._deep_limited = False
        self._deep_count = 0
        self._light_times: list[float] = []
        self._models = ModelRegistry()
        self._optimizers: list[weakref.ref] = []
        self._opt_labels: dict[int, str] = {}
        self._period = OptimizerPeriod()
        self._optimizer_mode = False  # some optimizer stepped: steps end at optimizer steps
        self.boundary_kind: str | None = None  # "optimizer", "update", "zero_grad", "forward", "data"
        self._opt_depth = 0
        self._opt_t0 = 0.0
        self._opt_times: dict[str, float] = {}
        self._closure_backwards = 0
        self._snapshot: _Snapshot | None = None
        self._versions: int | None = None  # parameter versions after the last backward
        self._update_seen = False  # a no-optimizer loop updates through version-visible ops
        self._fwd_depth = 0
        self._step = 0
        self._phase = "data"
        self._started = False  # step 0 starts at the first phase event, not at import
        self._t_phase = time.perf_counter()
        self._step_start = self._t_phase
        self._acc = dict.fromkeys(_PHASE_KEYS, 0.0)
        self._losses: list[tuple[torch.Tensor, bool]] = []  # (value, part of the objective)
        self._pending: list[tuple[StepSample, list[tuple[torch.Tensor, bool]], Any, DeviceTimes | None,
                                  tuple[Any, Any] | None]] = []
        # CUDA: a timing event where the open step began (after the advisor's own boundary work),
        # paired with one at its end: the step's time on the device's timeline (device_time_s).
        self._start_event: Any = None
        self._first_forward_callbacks: list[Callable[[torch.nn.Module], None]] = []
        self._eval_iters: weakref.WeakSet = weakref.WeakSet()  # DataLoader iterators of eval passes
        self._last_fetch: weakref.ref | None = None
        self.disabled = False
        self.interrupt_pending = False  # a Ctrl-C swallowed where Python ignores exceptions
        self._spec_sent = False
        self._stop_pending = False
        self._scaled_loss: tuple[weakref.ref, torch.Tensor] | None = None  # (scale(loss), loss)
        # Several controllers (a multi-node job): rank 0's commands reach every rank at boundaries.
        self.relay: CommandRelay | None = None
        if self.config.get("multinode"):
            self.relay = CommandRelay(
                rank=rank, local_rank=env_rank()[1], world_size=world_size, config=dict(self.config["multinode"]),
                deliver=self._run_command,
                emit=lambda name, data: self.emit(Event(rank=self.rank, step=self._step, name=name, data=data)))

    # -- AgentContext ----------------------------------------------------------------
    @property
    def step(self) -> int:
        return self._step

    @property
    def phase(self) -> str:
        return self._phase

    @property
    def step_start(self) -> float:
        return self._step_start

    def models(self) -> list[torch.nn.Module]:
        return self._models.models()

    def wrapped_models(self) -> list[torch.nn.Module]:
        return self._models.wrapped_models()

    def model_labels(self) -> list[str]:
        """Each of ``wrapped_models()``'s name in the script, in the same order."""
        return self._models.labels()

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for ref in self._optimizers if (o := ref()) is not None]

    def subscribe_module_events(self, pre: Any, post: Any) -> Callable[[], None]:
        """Receive every module forward pre/post event from the agent's global hooks
        (``AgentContext.subscribe_module_events``); returns the unsubscribe function."""
        return self.module_events.subscribe(pre, post)

    def target(self) -> Target:
        """What remedies act on (models, optimizers, schedulers, wrappers, group, device)."""
        return self.capture.target(self)

    def module_name(self, module: torch.nn.Module) -> str | None:
        return self._models.module_name(module)

    def refresh_names(self) -> None:
        """Rebuild the module-name map (after a remedy changed the module tree)."""
        self._models.refresh_names()

    def in_backward(self) -> bool:
        return torch._C._current_graph_task_id() != -1

    def emit(self, record: Record) -> None:
        try:
            self._emit_fn(record)
        except Exception:  # emitting must never break training
            pass

    def warn(self, message: str, **data: Any) -> None:
        self.emit(Event(rank=self.rank, step=self._step, name="warning", data={"message": message, **data}))

    def request_deep(self, steps: int, probes: Iterable[str] | None = None) -> None:
        if probes is None:
            self._deep_extra = max(self._deep_extra, int(steps))
        else:
            self._solo_extra = max(self._solo_extra, int(steps))
            self._solo_names = self._solo_names | frozenset(probes)

    def deep_next(self) -> bool:
        """Whether the shared probes deep-sample the next step, or the one after the solo steps
        asked for now (as known now: a boundary's stop_deep calls run before it is decided; the
        compute probe's stop, which asks for its timed step, runs before the memory probe's)."""
        step = self._step + 1
        solo, shared = self._split_probes()
        if solo and shared:
            step += self._solo_extra  # the solo probes' own steps come first
        return self._deep_extra > 0 or self.is_deep(step)

    def _split_probes(self) -> tuple[list[Probe], list[Probe]]:
        """(solo, shared): the probes that time on steps of their own, and the others."""
        solo = [p for p in self.probes if getattr(p, "deep_solo", False)]
        return solo, [p for p in self.probes if not getattr(p, "deep_solo", False)]

    def _deep_schedule(self, full: bool) -> tuple[list[Probe], bool]:
        """The probes to deep-sample the step that begins now, and whether it is one of the
        shared probes' deep steps (a request without names counts it).

        A probe with ``deep_solo`` (the compute probe) has steps of its own: with the memory
        tracker under it, the profiler's op times held the tracker's dispatch-mode Python (79 ms
        of ops in a 46 ms GPT step), and its counter and the tracker on one step (two dispatch
        modes, every op through both) made that step 3.6-5.6x a light GPT step with two threads.
        The first step of a run of scheduled deep steps runs the shared probes and books the solo
        probes' ``solo_steps`` (the compute probe: 2, its counting step and the timed step it
        then asks for with ``request_deep(1, probes=("compute",))``) right after it; they take
        the places of the next shared ones, so the default steps 1-3 run: 1 the memory and comm
        probes, 2 the compute probe's counting, 3 its timing. Steps requested without names (an
        apply's window) run the shared probes only."""
        if not full and self._solo_extra == 0:  # a light step, the common case: nothing to split
            self._solo_ran = False
            return [], False
        probes = list(self.probes)
        solo, shared = self._split_probes()
        named = [p for p in probes if p.name in self._solo_names]  # the solo steps' probes
        if not (solo and shared):  # nothing to keep apart
            if full:
                self._solo_extra = max(0, self._solo_extra - 1)  # the solo probes run on this one
                return probes, True
            self._solo_extra -= 1
            return named, False
        if self._solo_extra > 0:
            self._solo_extra -= 1
            self._solo_ran = True
            return named, False
        if self.is_deep(self._step) and not self._solo_ran:
            self._solo_extra = max(getattr(p, "solo_steps", 1) for p in solo)
            self._solo_names = self._solo_names | frozenset(p.name for p in solo)
        return shared, True

    def on_first_forward(self, callback: Callable[[torch.nn.Module], None]) -> None:
        """Run ``callback(model)`` when the first model is found, before its forward runs (plans)."""
        self._first_forward_callbacks.append(callback)

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
                # A rank held for the decision goes on, once the apply is queued: set before, the
                # boundary's executor ran without it and the apply slipped a step.
                self._decision.set()

    def _run_command(self, command: dict[str, Any]) -> None:
        kind = command.get("type")
        if kind == "stop":
            # Stop cleanly at the next boundary, like --steps.
            self.max_steps = self._step + 1
            return
        if kind in ("apply", "revert"):
            self._ensure_executor().submit(command_from_dict(command))  # typed; ValueError if malformed

    def _ensure_executor(self) -> Any:
        if self.executor is None:
            self.executor = Executor(self)
        return self.executor

    def load_plan(self, path: str | None) -> None:
        """Apply a plan file's remedies at the first forward of the model (``--plan``)."""
        if not path:
            return
        plan = load_plan(path)
        self.on_first_forward(lambda model: apply_plan_before_first_step(
            self, plan, model=model, executor=self._ensure_executor()))

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
            raise StopTraining(f"stopped after {self._step} steps (--steps)")

    def _flush_phase(self, now: float) -> None:
        if not self._started:
            self._started = True
            self._step_start = self._t_phase = now
        self._acc[self._phase] += now - self._t_phase
        self._t_phase = now

    def _set_phase(self, phase: str) -> None:
        now = time.perf_counter()
        self._flush_phase(now)
        self._phase = phase
        for probe in self.probes:
            self._call(probe, "on_phase", phase, now)

    def _idle_phase(self) -> str:
        """Between events: inside a closure optimizer's step it is still the optimizer's time."""
        return "optimizer" if self._opt_depth > 0 else "other"

    def _call(self, probe: Probe, hook: str, *args: Any) -> Any:
        try:
            return getattr(probe, hook)(self, *args)
        except (StopTraining, torch.OutOfMemoryError):
            raise  # an enforced budget is the probe's job to raise
        except Exception as exc:  # a broken probe is reported once and switched off
            self.probes = [p for p in self.probes if p is not probe]
            self.warn(f"probe {probe.name} disabled after {hook} failed: {type(exc).__name__}: {exc}")
            return None

    # -- hook callbacks --------------------------------------------------------------
    def forward_pre(self, module: torch.nn.Module) -> None:
        if self.disabled or torch._C._current_graph_task_id() != -1:
            return  # recomputation under checkpointing runs forwards inside backward
        self._fwd_depth += 1
        if self._fwd_depth != 1:
            return
        self._check_interrupt()
        training = torch.is_grad_enabled()
        if training:
            self._fallback_boundary("forward")
            self._stop_if_due()
        self._discover_model(module)
        if training:
            if self._phase in ("data", "other", "eval", "optimizer"):
                self._set_phase("forward")  # inside optimizer.step: a closure's forward
        elif self._phase in ("data", "other"):
            # A forward under no_grad outside the training forward: an evaluation pass.
            fetched = self._last_fetch() if self._last_fetch is not None else None
            if fetched is not None and self._phase == "data":
                self._eval_iters.add(fetched)  # its next batches are eval time too
            self._set_phase("eval")

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
            self._losses.append((loss.detach(), counted))
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
        self._confirm_candidates(by_grad=True)
        if not self._optimizer_mode:
            self._versions = self._parameter_versions()
            self._snapshot = self._take_snapshot(time.perf_counter())

    def zero_grad_called(self) -> None:
        """``Module.zero_grad`` or ``Optimizer.zero_grad``: a step boundary in a loop without optimizer steps."""
        if not self.disabled:
            self._check_interrupt()
            self._fallback_boundary("zero_grad")

    def data_start(self, iterator: Any = None) -> str:
        previous = self._phase
        if self.disabled:
            return previous
        self._check_interrupt()
        self._fallback_boundary("data")
        previous = self._phase
        if iterator is not None:
            self._last_fetch = weakref.ref(iterator)
        if previous == "eval" and iterator is not None and iterator in self._eval_iters:
            return previous  # the next batch of an evaluation pass
        if previous != "data":
            self._set_phase("data")
        return "data" if previous == "eval" else previous

    def data_end(self, previous: str) -> None:
        if not self.disabled and previous != self._phase:
            self._set_phase(previous)

    def optimizer_created(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.disabled and not any(ref() is optimizer for ref in self._optimizers):
            self._optimizers.append(weakref.ref(optimizer))
            taken = self._opt_labels.values()
            self._opt_labels[id(optimizer)] = unique_label(None, type(optimizer).__name__, taken)
            self._emit_optimizer(optimizer)

    def optimizer_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if self.disabled:
            return
        self._check_interrupt()
        self.optimizer_created(optimizer)
        if self._opt_depth == 0:
            if not self._optimizer_mode:
                self._optimizer_mode = True
                self._snapshot = None
                self._period.start(self.optimizers())
                self._set_boundary_kind("optimizer")
            if self._period.is_repeat(optimizer):
                self._close_at_snapshot("optimizer", learn=True)
            self._stop_if_due()
            self._confirm_candidates(optimizer=optimizer)
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
        label = self._opt_labels.get(id(optimizer), type(optimizer).__name__)
        self._opt_times[label] = self._opt_times.get(label, 0.0) + now - self._opt_t0
        complete = self._period.stepped(optimizer)
        self._snapshot = self._take_snapshot(now)
        if complete:
            self._boundary("optimizer", now)
        else:
            self._set_phase("other")

    # -- discovery -------------------------------------------------------------------
    def _discover_model(self, module: torch.nn.Module) -> None:
        self._models_found(self._models.see(module, self.optimizers()))

    def _confirm_candidates(self, *, optimizer: Any = None, by_grad: bool = False) -> None:
        optimizers = [optimizer] if optimizer is not None else self.optimizers()
        self._models_found(self._models.confirm(optimizers, by_grad=by_grad))

    def _models_found(self, found: list[tuple[torch.nn.Module, ModelInfo]]) -> None:
        for model, info in found:
            params = list(model.parameters())
            if params:
                self.device = params[0].device
            self.emit(ModelInfo(**{**info.to_dict(), "rank": self.rank}))
            callbacks, self._first_forward_callbacks = self._first_forward_callbacks, []
            for callback in callbacks:  # each runs once, when the first model is found
                callback(model)

    def _emit_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        groups = []
        for group in getattr(optimizer, "param_groups", []):
            groups.append({k: v for k, v in group.items()
                           if k != "params" and isinstance(v, (int, float, str, bool, type(None)))})
        count = sum(p.numel() for g in getattr(optimizer, "param_groups", []) for p in g["params"])
        self.emit(OptimizerInfo(rank=self.rank, name=type(optimizer).__name__, parameter_count=count,
                                param_groups=groups, label=self._opt_labels.get(id(optimizer))))

    # -- step boundaries -------------------------------------------------------------
    def is_deep(self, step: int) -> bool:
        if step in self.deep_steps:
            return True
        return bool(self.deep_every) and step > 0 and step % self.deep_every == 0

    def _set_boundary_kind(self, kind: str) -> None:
        if kind == self.boundary_kind:
            return
        self.boundary_kind = kind
        self.emit(Event(rank=self.rank, step=self._step, name="step_boundary",
                        data={"kind": kind, "message": _BOUNDARY_TEXT[kind]}))
        if kind != "optimizer":  # the user is told how a loop without optimizer was cut into steps
            self.warn(_BOUNDARY_TEXT[kind], boundary=kind)

    def _parameter_versions(self) -> int:
        """Sum of the models' parameter version counters: in-place updates under no_grad bump
        them (``p -= lr * p.grad``); an update through ``p.data`` does not."""
        return sum(p._version for model in self.models() for p in model.parameters())

    def _fallback_boundary(self, event: str) -> None:
        """In a loop without optimizer steps, a step ends at the first zero_grad, training
        forward or batch fetch after a backward (after the update, when updates are visible)."""
        if self._optimizer_mode or self._snapshot is None or self._opt_depth or self.in_backward():
            return  # the snapshot is taken at each backward's end: none means no backward yet
        if self.optimizers():
            return  # an optimizer exists: its first step will end this step
        versions = self._parameter_versions()
        if self._versions is not None and versions != self._versions:
            self._update_seen = True
            kind = "update"
        elif self._update_seen:
            return  # accumulating gradients: the update has not come yet
        else:
            kind = event
        self._set_boundary_kind(kind)
        self._boundary(kind, time.perf_counter())

    def _take_snapshot(self, now: float) -> _Snapshot:
        self._flush_phase(now)
        return _Snapshot(time=now, acc=dict(self._acc), n_losses=len(self._losses),
                         opt_times=dict(self._opt_times))

    def _close_at_snapshot(self, kind: str, *, learn: bool) -> None:
        """The step ended at the last snapshot: close it there, and carry what ran since
        into the next step (an optimizer that stepped twice, or the end of the script)."""
        snap = self._snapshot
        if snap is None:
            return
        self._flush_phase(time.perf_counter())
        carry_acc = {k: self._acc[k] - snap.acc.get(k, 0.0) for k in self._acc}
        carry_losses = self._losses[snap.n_losses:]
        carry_opt = {k: v - snap.opt_times.get(k, 0.0) for k, v in self._opt_times.items()
                     if v - snap.opt_times.get(k, 0.0) > 0}
        self._acc, self._losses, self._opt_times = dict(snap.acc), self._losses[:snap.n_losses], dict(snap.opt_times)
        if learn:
            self._period.learn_from_stepped()
            labels = [self._opt_labels.get(id(o), type(o).__name__) for o in self.optimizers()
                      if self._period.is_repeat(o)]
            self.emit(Event(rank=self.rank, step=self._step, name="step_period", data={"optimizers": labels}))
        was_deep = self._deep_active
        self._close_step(snap.time, kind)
        self._acc, self._losses, self._opt_times = carry_acc, carry_losses, carry_opt
        if not learn:
            return
        # The new step began at the snapshot and is already under way: no deep probe can
        # start in its middle, so a deep step due now runs one step later.
        if self._deep_extra > 0 or self.is_deep(self._step) or was_deep:
            self._deep_extra += 1
        self._after_boundary(deep=False)

    def _boundary(self, kind: str, now: float) -> None:
        self._flush_phase(now)
        self._close_step(now, kind, on_device=True)
        self._phase = "data"
        self._after_boundary(deep=True)
        # The advisor's own work at this boundary (the deep probes' teardown and set-up, the
        # one-off device micro-benchmark, an apply) is not the next step's data wait.
        self._step_start = self._t_phase = time.perf_counter()
        self._start_event = self._device_mark()

    def _device_mark(self) -> Any:
        """A timing event recorded now on the job device's current CUDA stream, or None off CUDA."""
        return timing_event(self.device) if self.device.type == "cuda" else None

    def _close_step(self, end: float, kind: str, *, on_device: bool = False) -> None:
        """Emit the open step, which ended at ``end`` (its accounting is flushed to ``end``).
        ``on_device``: the step ends now (a boundary hook), so a CUDA event recorded here ends
        it on the device's timeline too; a step closed later, at a snapshot, gets no device time."""
        step = self._step
        start_event, self._start_event = self._start_event, None
        step_events = (start_event, self._device_mark()) if on_device and start_event is not None else None
        deep = self._deep_active
        if deep:
            # Reverse order: probes push dispatch modes and saved-tensor hooks, which pop LIFO.
            for probe in reversed(self._deep_running):
                self._call(probe, "stop_deep", step)
            self._deep_active = False
        deep_probes = [p.name for p in self._deep_running] if deep else []
        self._deep_running = []
        extra: dict[str, Any] = {}
        for probe in list(self.probes):
            extra.update(self._call(probe, "on_step_end", step) or {})
        module_times = self._block_timer.stop() if self._block_timer.active else ({}, {})
        module_forward_s, module_recompute_s = ({}, {}) if isinstance(module_times, DeviceTimes) else module_times
        eval_s = self._acc.get("eval", 0.0)
        sample = StepSample(
            index=step,
            rank=self.rank,
            end_time=time.time(),
            time_s=end - self._step_start - eval_s,
            loss=None,
            micro_batches=len(self._losses),
            phases={_PHASE_KEYS[k]: v for k, v in self._acc.items() if k != "eval"},
            peak_memory_bytes=extra.get("peak_memory_bytes"),
            deep=deep,
            eval_s=eval_s,
            boundary=kind,
            optimizer_s=dict(self._opt_times),
            module_forward_s=module_forward_s,
            module_recompute_s=module_recompute_s,
            deep_probes=deep_probes,
        )
        self._queue_sample(sample, self._losses,
                           module_times if isinstance(module_times, DeviceTimes) else None, step_events)
        self._losses, self._opt_times = [], {}
        self._snapshot = None
        self._period.reset()
        self.recent_steps.append(sample)
        if self.executor is not None:
            self.executor.on_step_end(sample)
        self._bound_deep_cost(sample)
        self._step = step + 1
        self._acc = dict.fromkeys(_PHASE_KEYS, 0.0)
        self._step_start = self._t_phase = end

    def _after_boundary(self, *, deep: bool) -> None:
        if self.max_steps is not None and self._step >= self.max_steps:
            # Stop at the next step's first training event, not here: the rest of this loop
            # iteration (the script's logging, scheduler, checkpoint saving) still runs.
            self.flush(sync=True)
            self._stop_pending = True
            return
        self._hold_for_decision()
        if self.relay is not None:
            self.relay.exchange(self._step)
        if self.executor is not None:
            self.executor.on_boundary(self._step)
        if not self._spec_sent:
            self._send_device_spec()
        if deep:
            full = self._deep_extra > 0 or self.is_deep(self._step)
            self._deep_running, shared_step = self._deep_schedule(full)
            if self._deep_extra > 0 and (shared_step or not self.probes):
                self._deep_extra -= 1
            self._deep_active = bool(self._deep_running) or (full and not self.probes)
            if self._deep_active:
                self._deep_count += 1
                for probe in self._deep_running:
                    self._call(probe, "start_deep", self._step)
            elif self.light_timing_due(self._step):
                blocks = {key: name for key, name in self._models.names().items() if numbered(name)}
                if blocks:
                    self._block_timer.start(blocks, self.subscribe_module_events, device=self.device)
        self.flush(sync=False)

    def _hold_for_decision(self) -> None:
        """At the boundary before the step an apply was asked for (``apply_hold_step``), send
        every record so far and wait for the controller's decision: an apply command, or a
        release when it applies nothing there. Without the wait the apply landed wherever the
        advice happened to be ready: faster deep steps moved a named remedy from step 5 to 6.
        One wait per job, bounded by ``apply_hold_s``; in a multi-node job on rank 0 only (the
        others wait for it in the relay's exchange)."""
        step = self._hold_step
        if step is None or self._step != step - 1 or (self.relay is not None and self.rank != 0):
            return
        self.holding = True  # every rank waits at this boundary: a command now can land at the next
        self._hold_step = None
        self.flush(sync=True)
        start = time.perf_counter()
        try:
            decided = self._decision.wait(self._hold_s)
        finally:
            self.holding = False
        self.emit(Event(rank=self.rank, step=self._step, name="apply_hold",
                        data={"at_step": step, "waited_s": time.perf_counter() - start, "decided": decided}))
        if not decided:
            self.warn(f"no decision from the controller on the apply asked for at step {step} after "
                      f"{self._hold_s:.0f} s: training goes on", at_step=step)

    def stop_timing(self) -> None:
        """End a light step's block timing cut short (at exit, or when the hooks are uninstalled):
        its saved-tensor hooks must not outlive the agent on autograd's stack."""
        if self._block_timer.active:
            self._block_timer.stop()

    def holds_before(self, step: int) -> bool:
        """Whether this rank waits for the controller's decision at the boundary before ``step``:
        now, or still ahead of it (its step count already says ``step - 1`` while the boundary's
        own work runs, before the wait begins: a command that came then slipped to ``step + 1``)."""
        return self.holding or (self._hold_step == step and self._step <= step - 1)

    @property
    def deep_active(self) -> bool:
        """Whether a deep-sampled step is under way (its probes may run a profiler of their own)."""
        return self._deep_active

    def light_timing_due(self, step: int) -> bool:
        """Whether light step ``step`` times its numbered modules' forward (the first is step
        every-1: after the default deep steps 1-3, before an apply at step 5)."""
        return light_timing_due(step, self.light_timing_every)

    def _bound_deep_cost(self, sample: StepSample) -> None:
        """Deep probes cost a few light steps; a deep step far slower (a Python-loop RNN under
        the dispatch modes) ends scheduled deep sampling, said in one event and a warning."""
        if not sample.deep:
            self._light_times = [*self._light_times[-31:], sample.time_s]
            return
        if self._deep_limited or not self._light_times:
            return
        steady = self._light_times[1:] or self._light_times  # step 0 carries one-off costs
        light = statistics.median(steady)
        limit = max(self.deep_max_slowdown * light, self.deep_min_s)
        if sample.time_s <= limit:
            return
        self._deep_limited = True
        self.deep_steps, self.deep_every = set(), 0
        data = {"step": sample.index, "deep_s": sample.time_s, "light_s": light,
                "slowdown": sample.time_s / light if light > 0 else None, "limit_s": limit}
        self.emit(Event(rank=self.rank, step=sample.index, name="deep_sampling_stopped", data=data))
        self.warn(f"deep step {sample.index} took {sample.time_s:.1f} s, {data['slowdown'] or 0:.0f}x a light "
                  f"step ({light:.3g} s): no more scheduled deep steps (limit {limit:.1f} s)", **data)

    def _send_device_spec(self) -> None:
        """Measure the device's ceilings once, after step 0 and before any deep probe starts:
        the micro-benchmarks allocate, and must not show up in a tracked step."""
        self._spec_sent = True
        if "compute" not in self.config.get("probes", ()):
            return
        # Under an enforced budget on CUDA the job's allocator is capped: the micro-benchmarks'
        # 2.3 GiB would run it out (an H200 run's planned fit failed so), so only cached figures.
        cached_only = (self.device.type == "cuda" and bool(self.config.get("enforce_budget"))
                       and self.config.get("memory_budget_bytes") is not None)
        try:
            spec = detect_device_spec(self.device, peak_flops=self.config.get("peak_flops"),
                                      peak_bandwidth=self.config.get("peak_bandwidth"), cached_only=cached_only)
        except Exception as exc:  # noqa: BLE001 - no ceilings is a warning, not a failure
            self.emit(Event(rank=self.rank, name="warning",
                            data={"message": f"device ceilings unknown: {type(exc).__name__}: {exc}"}))
            return
        try:  # host-link copy bandwidth for the offload remedies (additive fields)
            link = host_link(self.device, override=self.config.get("host_link_bandwidth"), cached_only=cached_only)
        except Exception as exc:  # noqa: BLE001 - an unknown link leaves the offload cost assumed
            link = {"host_link_bandwidth": None, "host_link_source": f"unknown: {type(exc).__name__}: {exc}"}
        self.emit(Event(rank=self.rank, name="device_spec", data={**spec.to_dict(), **link}))
        if cached_only and not spec.measured_peak_flops:
            self.emit(Event(rank=self.rank, name="warning", data={
                "message": "device ceilings from the spec table: they are not measured under an enforced budget "
                           "(the micro-benchmarks take 2.3 GiB of device memory); an attach without "
                           "--enforce-budget measures and caches them"}))

    # -- loss without an extra device sync ---------------------------------------------
    def _queue_sample(self, sample: StepSample, losses: list[tuple[torch.Tensor, bool]],
                      device_times: DeviceTimes | None = None, step_events: tuple[Any, Any] | None = None) -> None:
        event = None
        on_cuda = bool(losses) and losses[0][0].is_cuda
        if on_cuda:
            # Copy to host asynchronously and read when the copy is done, so the
            # agent never adds a device synchronisation to the user's loop.
            losses = [(t.to("cpu", non_blocking=True), counted) for t, counted in losses]
        if on_cuda or device_times is not None or step_events is not None:
            event = torch.cuda.Event()
            # After the loss copy, the step's timed modules and its end event: done means all are.
            event.record()
        self._pending.append((sample, losses, event, device_times, step_events))

    def flush(self, *, sync: bool) -> None:
        """Emit queued step samples whose loss is readable (all of them if ``sync``)."""
        while self._pending:
            sample, losses, event, device_times, step_events = self._pending[0]
            if event is not None and not sync and not event.query():
                return
            if event is not None and sync:
                event.synchronize()
            self._pending.pop(0)
            values = [float(t.float().item()) for t, _ in losses]
            counted = [v for v, (_, c) in zip(values, losses) if c]
            # The objective whose gradient the step applied: gradients of several backward
            # calls add up, so the losses do too (nanoGPT divides each micro-batch's by K).
            loss = float(sum(counted)) if counted else None
            extra: dict[str, Any] = {}
            if device_times is not None:
                extra["module_forward_s"], extra["module_recompute_s"] = device_times.resolve()
            if step_events is not None:
                start, end = step_events
                end.synchronize()  # done already (``event`` was recorded after it)
                extra["device_time_s"] = max(0.0, start.elapsed_time(end) / 1e3 - sample.eval_s)
                self._device_times[sample.index] = extra["device_time_s"]
                if len(self._device_times) > EXECUTOR_HISTORY:
                    del self._device_times[min(self._device_times)]
            self.emit(StepSample(**{**sample.to_dict(), "loss": loss, "losses": values or None, **extra}))

    def device_step_times(self) -> dict[int, float]:
        """The recent steps' times on the device's timeline by index (CUDA; empty elsewhere), for
        the executor's before and after windows. Resolving the steps still pending waits for the
        device once: a decision's cost, never a light step's.

        The host's ``time_s`` of a step that follows a synchronised boundary counts its kernel
        launches, not its kernels: on an H100 an fp32 GPT's steps read 100 ms on the host against
        135 ms of kernels before an apply, and 124 ms against 164 ms after it."""
        if self.device.type != "cuda":
            return {}
        self.flush(sync=True)
        return dict(self._device_times)

    def close(self) -> None:
        """At exit: close a loop's last step without optimizer, emit what is pending, stop probes."""
        if (not self.disabled and not self._optimizer_mode and self._snapshot is not None
                and not self.optimizers()):  # an optimizer that never stepped: no step ended
            self._set_boundary_kind(self.boundary_kind or "exit")
            self._close_at_snapshot("exit", learn=False)
        self.stop_timing()
        self.flush(sync=True)
        if self.executor is not None:
            self.executor.close()  # reports a measurement window cut short by the exit
        for probe in reversed(list(self.probes)):
            self._call(probe, "detach")
        if self._step > 0 and self._deep_count == 0 and self.probes:
            self.warn(f"no step was deep-sampled ({self._step} step(s) ran; deep steps: "
                      f"{sorted(self.deep_steps) or 'none'}): memory by category, FLOPs and module "
                      "figures were not measured")
        self.disabled = True


def env_rank() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) otherwise."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))
