"""The wait for the controller's decision at the step an apply was asked for.

``advisor attach --apply X --apply-at-step K``: at the boundary before step K the job sends every
record so far and waits for the controller's decision, an apply command for K or a release when
it applies nothing there. Without the wait the apply landed wherever the advice happened to be
ready: faster deep steps moved a named remedy from step 5 to 6. One wait per job, bounded by
``apply_hold_s``; in a multi-node job on rank 0 only (the others wait for it in the command
relay's exchange).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from advisor.agent.outbox import Outbox


class ApplyHold:
    """The one wait of a job at ``apply_hold_step`` (``holds_before`` tells the executor about it)."""

    def __init__(self, *, at_step: int | None, wait_s: float, outbox: Outbox, step: Callable[[], int]) -> None:
        self._at_step = at_step
        self._wait_s = wait_s
        self._outbox = outbox
        self._step = step  # the step in progress
        self._decision = threading.Event()
        self.holding = False  # waiting at the boundary before the step an apply was asked for

    def decided(self) -> None:
        """The controller's decision came (an apply queued, or a release): a wait ends now.
        Set once the apply is queued: set before, the boundary's executor ran without it and the
        apply slipped a step."""
        self._decision.set()

    def holds_before(self, step: int) -> bool:
        """Whether this rank waits for the controller's decision at the boundary before ``step``:
        now, or still ahead of it (its step count already says ``step - 1`` while the boundary's
        own work runs, before the wait begins: a command that came then slipped to ``step + 1``)."""
        return self.holding or (self._at_step == step and self._step() <= step - 1)

    def wait_if_due(self, *, waits: bool, flush: Callable[[], None]) -> None:
        """At a boundary: wait here if it is the one before ``apply_hold_step`` and this rank
        ``waits``; ``flush`` sends every record so far first."""
        step = self._at_step
        if step is None or self._step() != step - 1 or not waits:
            return
        self.holding = True  # every rank waits at this boundary: a command now can land at the next
        self._at_step = None
        flush()
        start = time.perf_counter()
        try:
            decided = self._decision.wait(self._wait_s)
        finally:
            self.holding = False
        self._outbox.event("apply_hold", {"at_step": step, "waited_s": time.perf_counter() - start,
                                          "decided": decided})
        if not decided:
            self._outbox.warn(f"no decision from the controller on the apply asked for at step {step} after "
                              f"{self._wait_s:.0f} s: training goes on", at_step=step)
