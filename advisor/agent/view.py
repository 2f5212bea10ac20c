"""The agent as probes, plans and the apply executor see it: one object over its parts.

It implements ``advisor.records.context.AgentContext`` (for probes) and
``advisor.apply.host.ExecutorHost`` (for the executor) by handing each call to the part that
does it: the step clock, the script's objects, the deep-step schedule, the outbox and the apply
hold. It holds no state of its own and knows nothing of the agent's hooks.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from advisor.agent.clock import StepClock
from advisor.agent.deep import DeepSchedule
from advisor.agent.hold import ApplyHold
from advisor.agent.objects import ScriptObjects
from advisor.agent.outbox import Outbox
from advisor.apply.target import Target
from advisor.probes.module_events import ModuleEvents
from advisor.records.samples import Record, StepSample
from advisor.records.settings import AgentSettings


class AgentView:
    """``AgentContext`` and ``ExecutorHost`` over the agent's parts."""

    def __init__(self, *, settings: AgentSettings, clock: StepClock, objects: ScriptObjects, deep: DeepSchedule,
                 outbox: Outbox, hold: ApplyHold, module_events: ModuleEvents, relayed: bool) -> None:
        self.settings = settings
        self.rank, self.world_size = objects.rank, objects.world_size
        self.relayed = relayed
        self._clock, self._objects, self._deep = clock, objects, deep
        self._outbox, self._hold, self._module_events = outbox, hold, module_events

    # -- StepView
    @property
    def step(self) -> int:
        return self._clock.step

    @property
    def phase(self) -> str:
        return self._clock.phase

    @property
    def step_start(self) -> float:
        return self._clock.step_start

    def in_backward(self) -> bool:
        return self._clock.in_backward()

    # -- ModelView
    @property
    def device(self) -> torch.device:
        return self._objects.device

    def models(self) -> list[torch.nn.Module]:
        return self._objects.models()

    def wrapped_models(self) -> list[torch.nn.Module]:
        return self._objects.wrapped_models()

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self._objects.optimizers()

    def module_name(self, module: torch.nn.Module) -> str | None:
        return self._objects.module_name(module)

    # -- DeepRequests
    def request_deep(self, steps: int, probes: Iterable[str] | None = None) -> None:
        self._deep.request_deep(steps, probes)

    def deep_next(self) -> bool:
        return self._deep.deep_next()

    def release_deep(self, probes: Iterable[str]) -> None:
        self._deep.release(probes)

    # -- Emitter
    def emit(self, record: Record) -> None:
        self._outbox.emit(record)

    def subscribe_module_events(self, pre: Any, post: Any) -> Callable[[], None]:
        return self._module_events.subscribe(pre, post)

    # -- the executor's (ExecutorHost)
    def target(self) -> Target:
        return self._objects.target()

    @property
    def recent_steps(self) -> Iterable[StepSample]:
        return self._outbox.recent_steps

    def device_step_times(self) -> dict[int, float]:
        """The recent steps' device times (CUDA; empty elsewhere), for the executor's windows.

        The host's ``time_s`` of a step that follows a synchronised boundary counts its kernel
        launches, not its kernels: on an H100 an fp32 GPT's steps read 100 ms on the host against
        135 ms of kernels before an apply, and 124 ms against 164 ms after it."""
        return self._outbox.device_step_times() if self._objects.device.type == "cuda" else {}

    @property
    def holding(self) -> bool:
        return self._hold.holding

    def holds_before(self, step: int) -> bool:
        return self._hold.holds_before(step)
