"""The agent: discovers models, optimizers, steps and phases in an unmodified script.

Step boundaries are the post-hooks of the *primary* optimizer (the first one
seen stepping; a nested ``step`` such as ZeroRedundancyOptimizer's inner
optimizer does not count). A step's time runs from the previous boundary to
this one and is split into phases that add up to it exactly:

- ``data``: before the step's first forward, plus time inside
  ``DataLoader.__next__`` anywhere in the step (loading, and anything the loop
  does before its first forward: host-to-device copies, logging);
- ``forward``: from a root module's forward to ``backward()`` (the loss
  computation outside modules is included);
- ``backward``: inside ``torch.autograd.backward``;
- ``optimizer``: inside the primary optimizer's ``step``;
- ``other``: the rest (e.g. between backward and the optimizer step).

The agent is also the ``AgentContext`` that probes and the apply executor see.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from typing import Any, Callable

import torch

from advisor.agent.capture import Capture
from advisor.apply.executor import Executor
from advisor.apply.target import Target, unwrap
from advisor.apply.plan import apply_plan_before_first_step, load_plan
from advisor.probes.device.hostlink import host_link
from advisor.probes.device.spec import detect_device_spec
from advisor.probes.probe import Probe
from advisor.records.samples import Event, ModelInfo, OptimizerInfo, Record, StepSample

log = logging.getLogger("advisor.agent")

_PHASE_KEYS = {"data": "data_s", "forward": "forward_s", "backward": "backward_s",
               "optimizer": "optimizer_s", "other": "other_s"}


class StopTraining(BaseException):
    """Raised from the optimizer hook to end the script cleanly after ``--steps N``.

    A ``BaseException`` so that a script's ``except Exception`` does not swallow it.
    """


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
        self.capture = Capture()  # what the script built, for remedies (installed by hooks.install)
        self.max_steps: int | None = self.config.get("max_steps")
        self.deep_steps: set[int] = set(self.config.get("deep_steps", [1, 2, 3]))
        self.deep_every: int = int(self.config.get("deep_every", 0) or 0)
        self._deep_extra = 0
        self._deep_active = False
        self._roots: list[tuple[weakref.ref, weakref.ref]] = []  # (unwrapped, wrapped)
        self._names: dict[int, str] = {}
        self._optimizers: list[weakref.ref] = []
        self._primary: weakref.ref | None = None
        self._opt_depth = 0
        self._fwd_depth = 0
        self._step = 0
        self._phase = "data"
        self._started = False  # step 0 starts at the first phase event, not at import
        self._t_phase = time.perf_counter()
        self._step_start = self._t_phase
        self._acc = dict.fromkeys(_PHASE_KEYS, 0.0)
        self._losses: list[torch.Tensor] = []
        self._pending: list[tuple[StepSample, list[torch.Tensor], Any]] = []
        self._first_forward_callbacks: list[Callable[[torch.nn.Module], None]] = []
        self.disabled = False
        self._spec_sent = False
        self._stop_pending = False
        self._scaled_loss: tuple[weakref.ref, torch.Tensor] | None = None  # (scale(loss), loss)

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
        return [m for ref, _ in self._roots if (m := ref()) is not None]

    def wrapped_models(self) -> list[torch.nn.Module]:
        return [m for _, ref in self._roots if (m := ref()) is not None]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for ref in self._optimizers if (o := ref()) is not None]

    def target(self) -> Target:
        """What remedies act on (models, optimizers, schedulers, wrappers, group, device)."""
        return self.capture.target(self)

    def module_name(self, module: torch.nn.Module) -> str | None:
        return self._names.get(id(module))

    def refresh_names(self) -> None:
        """Rebuild the module-name map (after a remedy changed the module tree)."""
        self._names = {}
        for model in self.models():
            for name, sub in model.named_modules():
                self._names.setdefault(id(sub), name)

    def in_backward(self) -> bool:
        return torch._C._current_graph_task_id() != -1

    def emit(self, record: Record) -> None:
        try:
            self._emit_fn(record)
        except Exception:  # emitting must never break training
            pass

    def request_deep(self, steps: int) -> None:
        self._deep_extra = max(self._deep_extra, int(steps))

    def on_first_forward(self, callback: Callable[[torch.nn.Module], None]) -> None:
        """Run ``callback(model)`` at the first root forward, before it runs (plans)."""
        self._first_forward_callbacks.append(callback)

    # -- commands from the controller (called on the channel's reader thread) ---------
    def submit_command(self, command: dict[str, Any]) -> None:
        kind = command.get("type")
        if kind == "stop":
            # Stop cleanly at the next boundary, like --steps.
            self.max_steps = self._step + 1
            return
        if kind in ("apply", "revert"):
            self._ensure_executor().submit(command)

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
    def _stop_if_due(self) -> None:
        if self._stop_pending:
            self._stop_pending = False
            self.disabled = True  # no more records after the last requested step
            raise StopTraining(f"stopped after {self._step} steps (--steps)")

    def _set_phase(self, phase: str) -> None:
        self._stop_if_due()
        now = time.perf_counter()
        if not self._started:
            self._started = True
            self._step_start = self._t_phase = now
        self._acc[self._phase] += now - self._t_phase
        self._phase = phase
        self._t_phase = now
        for probe in self.probes:
            self._call(probe, "on_phase", phase, now)

    def _call(self, probe: Probe, hook: str, *args: Any) -> Any:
        try:
            return getattr(probe, hook)(self, *args)
        except (StopTraining, torch.OutOfMemoryError):
            raise  # an enforced budget is the probe's job to raise
        except Exception as exc:  # a broken probe is reported once and switched off
            self.probes = [p for p in self.probes if p is not probe]
            self.emit(Event(rank=self.rank, step=self._step, name="warning",
                            data={"message": f"probe {probe.name} disabled after {hook} failed: "
                                             f"{type(exc).__name__}: {exc}"}))
            return None

    # -- hook callbacks --------------------------------------------------------------
    def forward_pre(self, module: torch.nn.Module) -> None:
        if self.disabled or torch._C._current_graph_task_id() != -1:
            return  # recomputation under checkpointing runs forwards inside backward
        self._fwd_depth += 1
        if self._fwd_depth != 1:
            return
        self._discover_model(module)
        if self._phase in ("data", "other"):
            self._set_phase("forward")

    def forward_post(self, module: torch.nn.Module) -> None:
        if self.disabled or torch._C._current_graph_task_id() != -1:
            return
        if self._fwd_depth > 0:
            self._fwd_depth -= 1

    def backward_start(self, tensors: Any) -> None:
        if self.disabled:
            return
        self._fwd_depth = 0  # a forward that raised never ran its post-hook
        pending, self._scaled_loss = self._scaled_loss, None
        loss = pending[1] if pending is not None and pending[0]() is tensors else tensors
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._losses.append(loss.detach())
        self._set_phase("backward")

    def loss_scaled(self, scaled: Any, loss: Any) -> None:
        """``GradScaler.scale(loss)`` returned ``scaled``; a backward on it records ``loss``."""
        if not self.disabled and isinstance(scaled, torch.Tensor) and isinstance(loss, torch.Tensor):
            self._scaled_loss = (weakref.ref(scaled), loss.detach())

    def backward_end(self) -> None:
        if not self.disabled:
            self._set_phase("other")

    def data_start(self) -> str:
        if not self.disabled:
            self._stop_if_due()  # stop before loading a batch for a step that will not run
        previous = self._phase
        if not self.disabled and previous != "data":
            self._set_phase("data")
        return previous

    def data_end(self, previous: str) -> None:
        if not self.disabled and previous != "data":
            self._set_phase(previous)

    def optimizer_created(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.disabled and not any(ref() is optimizer for ref in self._optimizers):
            self._optimizers.append(weakref.ref(optimizer))
            self._emit_optimizer(optimizer)

    def optimizer_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if self.disabled:
            return
        self._stop_if_due()
        self._opt_depth += 1
        if self._primary is None:
            self._primary = weakref.ref(optimizer)
        self.optimizer_created(optimizer)
        if self._opt_depth == 1:
            self._set_phase("optimizer")

    def optimizer_post(self, optimizer: torch.optim.Optimizer) -> None:
        if self.disabled:
            return
        self._opt_depth = max(0, self._opt_depth - 1)
        if self._opt_depth == 0:
            primary = self._primary() if self._primary is not None else None
            if optimizer is primary:
                self._boundary()
            else:
                self._set_phase("other")

    # -- discovery -------------------------------------------------------------------
    def _discover_model(self, module: torch.nn.Module) -> None:
        model, wrapper = unwrap(module)
        for ref, _ in self._roots:
            if ref() is model:
                return
        if self.module_name(model) is not None:
            return  # a submodule of a known model called on its own
        self._roots.append((weakref.ref(model), weakref.ref(module)))
        self.refresh_names()
        params = list(model.parameters())
        if params:
            self.device = params[0].device
        modules = []
        for name, sub in model.named_modules():
            if len(modules) >= 2000:
                break
            modules.append({
                "name": name,
                "type": type(sub).__name__,
                "depth": 0 if not name else name.count(".") + 1,
                "parameter_bytes": sum(p.numel() * p.element_size() for p in sub.parameters(recurse=False)),
            })
        self.emit(ModelInfo(
            rank=self.rank,
            name=type(model).__name__,
            wrapper=wrapper,
            parameter_count=sum(p.numel() for p in params),
            parameter_bytes=sum(p.numel() * p.element_size() for p in params),
            trainable_parameter_count=sum(p.numel() for p in params if p.requires_grad),
            modules=modules,
        ))
        callbacks, self._first_forward_callbacks = self._first_forward_callbacks, []
        for callback in callbacks:  # each runs once, at the first model's first forward
            callback(model)

    def _emit_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        groups = []
        for group in getattr(optimizer, "param_groups", []):
            groups.append({k: v for k, v in group.items()
                           if k != "params" and isinstance(v, (int, float, str, bool, type(None)))})
        count = sum(p.numel() for g in getattr(optimizer, "param_groups", []) for p in g["params"])
        self.emit(OptimizerInfo(rank=self.rank, name=type(optimizer).__name__,
                                parameter_count=count, param_groups=groups))

    # -- step boundary ---------------------------------------------------------------
    def is_deep(self, step: int) -> bool:
        if step in self.deep_steps:
            return True
        return bool(self.deep_every) and step > 0 and step % self.deep_every == 0

    def _boundary(self) -> None:
        now = time.perf_counter()
        self._acc[self._phase] += now - self._t_phase
        step = self._step
        deep = self._deep_active
        if deep:
            # Reverse order: probes push dispatch modes and saved-tensor hooks, which pop LIFO.
            for probe in reversed(list(self.probes)):
                self._call(probe, "stop_deep", step)
        extra: dict[str, Any] = {}
        for probe in list(self.probes):
            extra.update(self._call(probe, "on_step_end", step) or {})
        sample = StepSample(
            index=step,
            rank=self.rank,
            end_time=time.time(),
            time_s=now - self._step_start,
            loss=None,
            micro_batches=len(self._losses),
            phases={_PHASE_KEYS[k]: v for k, v in self._acc.items()},
            peak_memory_bytes=extra.get("peak_memory_bytes"),
            deep=deep,
        )
        self._queue_sample(sample, self._losses)
        self._losses = []
        if self.executor is not None:
            self.executor.on_step_end(sample)
        self._step = step + 1
        self._acc = dict.fromkeys(_PHASE_KEYS, 0.0)
        self._phase = "data"
        self._step_start = self._t_phase = now
        if self.max_steps is not None and self._step >= self.max_steps:
            # Stop at the next step's first event, not here: the rest of this loop
            # iteration (the script's logging, scheduler, checkpoint saving) still runs.
            self.flush(sync=True)
            self._stop_pending = True
            return
        if self.executor is not None:
            self.executor.on_boundary(self._step)
        if not self._spec_sent:
            self._send_device_spec()
        self._deep_active = self._deep_extra > 0 or self.is_deep(self._step)
        if self._deep_extra > 0:
            self._deep_extra -= 1
        if self._deep_active:
            for probe in list(self.probes):
                self._call(probe, "start_deep", self._step)
        # The advisor's own work at this boundary (the deep probes' teardown and set-up, the
        # one-off device micro-benchmark, an apply) is not the next step's data wait.
        self._step_start = self._t_phase = time.perf_counter()
        self.flush(sync=False)

    def _send_device_spec(self) -> None:
        """Measure the device's ceilings once, after step 0 and before any deep probe starts:
        the micro-benchmarks allocate, and must not show up in a tracked step."""
        self._spec_sent = True
        if "compute" not in self.config.get("probes", ()):
            return
        try:
            spec = detect_device_spec(self.device, peak_flops=self.config.get("peak_flops"),
                                      peak_bandwidth=self.config.get("peak_bandwidth"))
        except Exception as exc:  # noqa: BLE001 - no ceilings is a warning, not a failure
            self.emit(Event(rank=self.rank, name="warning",
                            data={"message": f"device ceilings unknown: {type(exc).__name__}: {exc}"}))
            return
        try:  # host-link copy bandwidth for the offload remedies (additive fields)
            link = host_link(self.device, override=self.config.get("host_link_bandwidth"))
        except Exception as exc:  # noqa: BLE001 - an unknown link leaves the offload cost assumed
            link = {"host_link_bandwidth": None, "host_link_source": f"unknown: {type(exc).__name__}: {exc}"}
        self.emit(Event(rank=self.rank, name="device_spec", data={**spec.to_dict(), **link}))

    # -- loss without an extra device sync ---------------------------------------------
    def _queue_sample(self, sample: StepSample, losses: list[torch.Tensor]) -> None:
        event = None
        if losses and losses[0].is_cuda:
            # Copy to host asynchronously and read when the copy is done, so the
            # agent never adds a device synchronisation to the user's loop.
            host = [t.to("cpu", non_blocking=True) for t in losses]
            event = torch.cuda.Event()
            event.record()
            losses = host
        self._pending.append((sample, losses, event))

    def flush(self, *, sync: bool) -> None:
        """Emit queued step samples whose loss is readable (all of them if ``sync``)."""
        while self._pending:
            sample, losses, event = self._pending[0]
            if event is not None and not sync and not event.query():
                return
            if event is not None and sync:
                event.synchronize()
            self._pending.pop(0)
            loss = None
            if losses:
                loss = float(sum(float(t.float().item()) for t in losses) / len(losses))
            self.emit(StepSample(**{**sample.to_dict(), "loss": loss}))

    def close(self) -> None:
        """At exit: emit what is pending, stop probes."""
        self.flush(sync=True)
        if self.executor is not None:
            self.executor.close()  # reports a measurement window cut short by the exit
        for probe in reversed(list(self.probes)):
            self._call(probe, "detach")
        self.disabled = True


def env_rank() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) otherwise."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))
