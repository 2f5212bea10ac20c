"""What the agent exposes to probes and to the apply executor: a typing protocol, no code.

It lives with the records because both ``probes/`` and ``apply/`` read it and neither may import
the other; torch appears only in annotations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterable

    import torch

    from advisor.records.samples import Record

PHASE_NAMES: tuple[str, ...] = ("data", "forward", "backward", "optimizer", "other", "eval")


class AgentContext(Protocol):
    """What the agent exposes to probes and to the apply executor."""

    rank: int
    world_size: int
    device: "torch.device"  # the device the model's parameters live on (cpu until known)
    config: dict[str, Any]  # the agent's settings (memory_budget_bytes, enforce_budget, ...)

    @property
    def step(self) -> int:
        """Index of the step in progress (0-based count of completed optimizer steps)."""

    @property
    def phase(self) -> str:
        """Current phase, one of ``PHASE_NAMES``."""

    @property
    def step_start(self) -> float:
        """``time.perf_counter()`` at the boundary that started the step in progress."""

    def models(self) -> list["torch.nn.Module"]:
        """Discovered root models, unwrapped (DDP/FSDP wrappers removed)."""

    def wrapped_models(self) -> list["torch.nn.Module"]:
        """Discovered root models as the script holds them (wrappers kept)."""

    def optimizers(self) -> list["torch.optim.Optimizer"]:
        """Optimizers seen stepping."""

    def module_name(self, module: "torch.nn.Module") -> str | None:
        """Qualified name of ``module`` inside its root model ("" for the root), or None."""

    def in_backward(self) -> bool:
        """True while autograd's engine runs a backward pass on this thread."""

    def emit(self, record: "Record") -> None:
        """Queue a record for the controller (never blocks, never raises)."""

    def request_deep(self, steps: int, probes: "Iterable[str] | None" = None) -> None:
        """Ask for the next ``steps`` steps to be deep-sampled (used to verify a remedy); with
        ``probes``, for those probes alone (the compute probe's timed step)."""

    def deep_next(self) -> bool:
        """Whether the step after the one in progress is deep-sampled for the shared probes, as
        known now (a probe's ``stop_deep`` may keep its set-up for it)."""

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
