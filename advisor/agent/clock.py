"""The open step's clock: which step and phase run now, and what each phase took so far.

A step's phases add up to its time by construction: every instant since the step began is
booked to the phase current at that instant (``flush``). Step 0 starts at the script's first
training event, not at import. A snapshot keeps the accounting at one instant (the end of an
optimizer step, or of a backward in a loop without an optimizer), so that a step found later to
have ended there can be closed after the fact, and what ran since carried into the next one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# Phase (``advisor.records.context.PHASE_NAMES``) -> its StepSample field (``eval`` is kept apart
# from the step's time).
PHASE_KEYS = {"data": "data_s", "forward": "forward_s", "backward": "backward_s",
              "optimizer": "optimizer_s", "other": "other_s", "eval": "eval_s"}

Losses = list[tuple[torch.Tensor, bool]]  # each backward's loss, and whether it is part of the objective


@dataclass
class Snapshot:
    """The open step's accounting at one instant."""

    time: float
    acc: dict[str, float]
    n_losses: int
    opt_times: dict[str, float]


@dataclass
class Carry:
    """What ran after a snapshot, for the step that began there."""

    acc: dict[str, float]
    losses: Losses
    opt_times: dict[str, float]


class StepClock:
    """The step in progress (index, phase, start) and its accounting (phases, losses, optimizers)."""

    def __init__(self) -> None:
        self.step = 0
        self.phase = "data"
        self._started = False  # step 0 starts at the first phase event, not at import
        self._t_phase = self.step_start = time.perf_counter()
        self.acc = dict.fromkeys(PHASE_KEYS, 0.0)
        self.losses: Losses = []  # (value, part of the objective)
        self.opt_times: dict[str, float] = {}  # seconds inside each optimizer's step, by label

    def in_backward(self) -> bool:
        """True while autograd's engine runs a backward pass on this thread."""
        return torch._C._current_graph_task_id() != -1

    def flush(self, now: float) -> None:
        """Book the time since the last flush to the current phase."""
        if not self._started:
            self._started = True
            self.step_start = self._t_phase = now
        self.acc[self.phase] += now - self._t_phase
        self._t_phase = now

    def switch(self, phase: str, now: float) -> None:
        self.flush(now)
        self.phase = phase

    def add_optimizer_time(self, label: str, seconds: float) -> None:
        self.opt_times[label] = self.opt_times.get(label, 0.0) + seconds

    def snapshot(self, now: float) -> Snapshot:
        self.flush(now)
        return Snapshot(time=now, acc=dict(self.acc), n_losses=len(self.losses), opt_times=dict(self.opt_times))

    def rewind(self, snap: Snapshot) -> Carry:
        """Put the accounting back to ``snap``; what ran since is returned, for the next step."""
        self.flush(time.perf_counter())
        carry = Carry(acc={k: self.acc[k] - snap.acc.get(k, 0.0) for k in self.acc},
                      losses=self.losses[snap.n_losses:],
                      opt_times={k: v - snap.opt_times.get(k, 0.0) for k, v in self.opt_times.items()
                                 if v - snap.opt_times.get(k, 0.0) > 0})
        self.acc, self.losses, self.opt_times = dict(snap.acc), self.losses[:snap.n_losses], dict(snap.opt_times)
        return carry

    def resume(self, carry: Carry) -> None:
        """The step that began at a snapshot takes what ran since."""
        self.acc, self.losses, self.opt_times = carry.acc, carry.losses, carry.opt_times

    def next_step(self, end: float) -> None:
        """The step in progress ended at ``end``: the next one begins there, with nothing booked."""
        self.step += 1
        self.acc = dict.fromkeys(PHASE_KEYS, 0.0)
        self.losses, self.opt_times = [], {}
        self.step_start = self._t_phase = end

    def restart(self, now: float) -> None:
        """The step in progress begins again at ``now`` (after the advisor's own work at its boundary)."""
        self.step_start = self._t_phase = now
