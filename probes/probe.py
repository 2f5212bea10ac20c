"""The contract between the agent and its probes.

The agent (``advisor.agent.agent``) owns the hooks that find models, optimizers, step
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

A probe reports by ``ctx.emit(record)`` with records from ``advisor.records.samples``.
Exceptions raised by a probe are caught by the agent, reported once as a
warning event, and the probe is disabled: a probe never breaks training.
"""

from __future__ import annotations

from typing import Any

from advisor.records.context import PHASE_NAMES, AgentContext

__all__ = ["PHASE_NAMES", "AgentContext", "Probe"]


class Probe:
    """Base class: override the hooks a probe needs; the defaults do nothing."""

    name: str = "probe"
    # Its deep steps run every op through a TorchDispatchMode: a torch.compile'd model then runs
    # other code than its compiled graph (nanoGPT's weights drifted by 7e-9 in three steps), so
    # such a probe does not deep-sample a compiled model unless asked (AgentSettings.deep_compiled).
    dispatch_mode_deep: bool = False

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
