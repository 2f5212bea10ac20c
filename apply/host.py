"""What the apply executor needs from the process it runs in: a typing protocol, no code.

The agent's view (``advisor.agent.view.AgentView``) implements it; tests drive the executor with
a hand-made context (``tests/fakes.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from advisor.records.context import AgentContext

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterable

    from advisor.apply.target import Target
    from advisor.records.samples import StepSample


class HoldView(Protocol):
    """The wait at the step an apply was asked for (``advisor.agent.hold.ApplyHold``)."""

    @property
    def holding(self) -> bool:
        """This rank waits at the boundary now."""

    def holds_before(self, step: int) -> bool:
        """Whether this rank waits for the controller's decision at the boundary before ``step``
        (now, or still ahead of it)."""


class ExecutorHost(AgentContext, HoldView, Protocol):
    """The agent as the executor sees it."""

    # Commands reach every rank at one boundary already (a multi-node job's command relay):
    # the ranks need not agree on where to start one.
    relayed: bool

    @property
    def recent_steps(self) -> "Iterable[StepSample]":
        """The last steps' samples, for an executor created after them (its before window)."""

    def target(self) -> "Target":
        """What the remedies act on: models, optimizers, schedulers, wrappers, group, device."""

    def device_step_times(self) -> dict[int, float]:
        """The recent steps' times on the device's timeline by index (empty off CUDA)."""
