"""What the agent exposes to probes and to the apply executor: typing protocols, no code.

They live with the records because both ``probes/`` and ``apply/`` read them and neither may
import the other; torch appears only in annotations. ``AgentContext`` is made of the interfaces of
the agent's parts (``advisor/agent/``): the step clock (``StepView``), the script's objects
(``ModelView``), the deep-step schedule (``DeepRequests``) and the outbox (``Emitter``). The
executor's wider view, ``advisor.apply.host.ExecutorHost``, adds the apply hold and the target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterable

    import torch

    from advisor.records.samples import Record
    from advisor.records.settings import AgentSettings

PHASE_NAMES: tuple[str, ...] = ("data", "forward", "backward", "optimizer", "other", "eval")


class StepView(Protocol):
    """The step in progress (``advisor.agent.clock.StepClock``)."""

    @property
    def step(self) -> int:
        """Index of the step in progress (0-based count of completed steps)."""

    @property
    def phase(self) -> str:
        """Current phase, one of ``PHASE_NAMES``."""

    @property
    def step_start(self) -> float:
        """``time.perf_counter()`` at the boundary that started the step in progress."""

    def in_backward(self) -> bool:
        """True while autograd's engine runs a backward pass on this thread."""


class ModelView(Protocol):
    """The script's models and optimizers (``advisor.agent.objects.ScriptObjects``)."""

    @property
    def device(self) -> "torch.device":
        """The device the model's parameters live on (cpu until known)."""

    def models(self) -> list["torch.nn.Module"]:
        """Discovered root models, unwrapped (DDP/FSDP wrappers removed)."""

    def wrapped_models(self) -> list["torch.nn.Module"]:
        """Discovered root models as the script holds them (wrappers kept)."""

    def optimizers(self) -> list["torch.optim.Optimizer"]:
        """Optimizers built or seen stepping."""

    def module_name(self, module: "torch.nn.Module") -> str | None:
        """Qualified name of ``module`` inside its root model ("" for the root), or None."""


class DeepRequests(Protocol):
    """Asking for deep-sampled steps (``advisor.agent.deep.DeepSchedule``)."""

    def request_deep(self, steps: int, probes: "Iterable[str] | None" = None) -> None:
        """Ask for the next ``steps`` steps to be deep-sampled (used to verify a remedy); with
        ``probes``, for those probes alone (the compute probe's timed step)."""

    def deep_next(self) -> bool:
        """Whether the step after the one in progress is deep-sampled for the shared probes, as
        known now (a probe's ``stop_deep`` may keep its set-up for it)."""

    def release_deep(self, probes: "Iterable[str]") -> None:
        """The steps still booked for ``probes`` alone are not needed (the compute probe timed its
        ops where it counted them): they are light steps."""


class Emitter(Protocol):
    """Reporting to the controller (``advisor.agent.outbox.Outbox``)."""

    def emit(self, record: "Record") -> None:
        """Queue a record for the controller (never blocks, never raises)."""


class AgentContext(StepView, ModelView, DeepRequests, Emitter, Protocol):
    """What the agent exposes to probes (and, widened, to the apply executor)."""

    rank: int
    world_size: int
    settings: "AgentSettings"  # the agent's settings (memory_budget_bytes, enforce_budget, ...)

    def subscribe_module_events(
        self,
        pre: "Callable[[torch.nn.Module, Any], None]",
        post: "Callable[[torch.nn.Module, Any, Any], None]",
    ) -> "Callable[[], None]":
        """Call ``pre(module, args)`` / ``post(module, args, output)`` from the agent's own
        global module forward hooks, after the agent's work (so ``module_name`` knows the
        module); returns the function that unsubscribes. One hook set serves every probe
        (advisor.probes.module_events). Optional: a probe falls back to hooks of its own when a
        context lacks it."""
