"""Figures over every step of a rank, in constant memory per step.

The live state keeps only the last ``MAX_LIVE_STEPS`` step records per rank (a
record with its phases is about a kilobyte as Python objects); the summary must
still cover every step. ``StepTotals`` keeps a count, sums, and each step's time
as 8 bytes in an ``array`` (exact medians: a million steps is 8 MB).
"""

from __future__ import annotations

import statistics
import threading
from array import array
from typing import Any

from advisor.records.samples import PHASES

# Which steps the steady-state figures use: after the warm-up step 0, and not deep-sampled
# (deep probes slow a step down); the fallbacks are for runs too short to have such steps.
_STEADY, _DEEP, _WARMUP = 0, 1, 2


class StepTotals:
    """Count, last index and loss, and per-category times and phase sums of one rank's steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.last_index = -1
        self.last_loss: float | None = None
        self._times = (array("d"), array("d"), array("d"))
        self._phases: tuple[dict[str, float], ...] = ({}, {}, {})

    def add(self, index: int, time_s: float, deep: bool, loss: float | None, phases: dict[str, float]) -> None:
        category = _WARMUP if index == 0 else _DEEP if deep else _STEADY
        with self._lock:
            self.count += 1
            self.last_index = index
            self.last_loss = loss
            self._times[category].append(time_s)
            sums = self._phases[category]
            for key in PHASES:
                sums[key] = sums.get(key, 0.0) + float(phases.get(key, 0.0) or 0.0)

    def add_many(self, category: str, times: Any, phase_sums: dict[str, float]) -> None:
        """Fold steps summed elsewhere (``category``: "steady", "deep" or "warmup")."""
        index = {"steady": _STEADY, "deep": _DEEP, "warmup": _WARMUP}[category]
        with self._lock:
            before = len(self._times[index])
            self._times[index].extend(times)
            self.count += len(self._times[index]) - before
            sums = self._phases[index]
            for key in PHASES:
                sums[key] = sums.get(key, 0.0) + float(phase_sums.get(key) or 0.0)

    def set_last(self, index: int, loss: float | None) -> None:
        with self._lock:
            self.last_index, self.last_loss = index, loss

    def summary(self) -> dict[str, Any]:
        """The report's summary figures over every step (the old per-list rules, same keys)."""
        with self._lock:
            for chosen in ((_STEADY,), (_STEADY, _DEEP), (_STEADY, _DEEP, _WARMUP)):
                times = [t for c in chosen for t in self._times[c]]
                if times:
                    break
            else:
                return {"steps": 0}
            total = sum(times) or 1e-12
            phases = {k: sum(self._phases[c].get(k, 0.0) for c in chosen) / total for k in PHASES}
            return {"steps": self.count, "median_step_s": statistics.median(times),
                    "mean_step_s": total / len(times), "phase_share": phases, "last_loss": self.last_loss}
