"""The contract between the agent and its probes.

The agent (``probes.agent``) owns the hooks that find models, optimizers, step
boundaries and phases. A probe never installs its own global step hooks; it
subclasses ``Probe`` and the agent calls it:

- ``attach`` once, when the agent starts (before the user's script runs);
- ``on_phase`` at every phase transition of every step (keep it cheap: this is
  the light path, bounded by ``bench/overhead.py``);
- ``start_deep`` at the step boundary *before* a deep-sampled step (right
  after the previous optimizer step, so the deep step's data loading is seen),
  and ``stop_deep`` at the boundary that ends it; deep probes may cost a few
  times a step;
- ``on_exception`` when the user's script raises (the OOM flight recorder);
- ``detach`` once at exit.

A probe reports by ``ctx.emit(record)`` with records from ``probes.records``.
Exceptions raised by a probe are caught by the agent, reported once as a
warning event, and the probe is disabled: a probe never breaks training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from probes.records import Record

PHASE_NAMES: tuple[str, ...] = ("data", "forward", "backward", "optimizer", "other")


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

    def request_deep(self, steps: int) -> None:
        """Ask for the next ``steps`` steps to be deep-sampled (used to verify a remedy)."""


class Probe:
    """Base class: override the hooks a probe needs; the defaults do nothing."""

    name: str = "probe"

    def attach(self, ctx: AgentContext) -> None:
        pass

    def on_phase(self, ctx: AgentContext, phase: str, now: float) -> None:
        """``phase`` just began at ``now`` (``time.perf_counter()``)."""

    def start_deep(self, ctx: AgentContext, step: int) -> None:
        pass

    def stop_deep(self, ctx: AgentContext, step: int) -> None:
        pass

    def on_step_end(self, ctx: AgentContext, step: int) -> dict[str, Any]:
        """Light per-step figures merged into that step's ``StepSample`` (e.g. peak memory)."""
        return {}

    def on_exception(self, ctx: AgentContext, exc: BaseException) -> None:
        pass

    def detach(self, ctx: AgentContext) -> None:
        pass
