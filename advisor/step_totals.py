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

# Which steps the steady-state figures use: after the warm-up step 0, not deep-sampled (deep probes
# slow a step down) and not right after a deep one (it pays for their teardown; as
# ``advisor.records.samples.ordinary_steps``); the fallbacks are for runs too short to have such steps.
_STEADY, _DEEP, _WARMUP, _SETTLING = 0, 1, 2, 3
CATEGORIES = {"steady": _STEADY, "deep": _DEEP, "warmup": _WARMUP, "settling": _SETTLING}


def category(index: int, deep: bool, previous: tuple[int, bool] | None) -> str:
    """A step's category from its index, whether it was deep, and the (index, deep) of the step
    of its rank before it."""
    if index == 0:
        return "warmup"
    if deep:
        return "deep"
    return "settling" if previous is not None and previous == (index - 1, True) else "steady"


class StepTotals:
    """Count, last index and loss, and per-category times and phase sums of one rank's steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.last_index = -1
        self.last_loss: float | None = None
        self._times = (array("d"), array("d"), array("d"), array("d"))
        self._phases: tuple[dict[str, float], ...] = ({}, {}, {}, {})
        self._previous: tuple[int, bool] | None = None

    def add(self, index: int, time_s: float, deep: bool, loss: float | None, phases: dict[str, float]) -> None:
        kind = CATEGORIES[category(index, deep, self._previous)]
        self._previous = (index, deep)
        with self._lock:
            self.count += 1
            self.last_index = index
            self.last_loss = loss
            self._times[kind].append(time_s)
            sums = self._phases[kind]
            for key in PHASES:
                sums[key] = sums.get(key, 0.0) + float(phases.get(key, 0.0) or 0.0)

    def add_many(self, category: str, times: Any, phase_sums: dict[str, float]) -> None:
        """Fold steps summed elsewhere (``category``: a key of ``CATEGORIES``)."""
        index = CATEGORIES[category]
        with self._lock:
            before = len(self._times[index])
            self._times[index].extend(times)
            self.count += len(self._times[index]) - before
            sums = self._phases[index]
            for key in PHASES:
                sums[key] = sums.get(key, 0.0) + float(phase_sums.get(key) or 0.0)

    def set_last(self, index: int, loss: float | None, deep: bool | None = None) -> None:
        with self._lock:
            self.last_index, self.last_loss = index, loss
            if deep is not None:
                self._previous = (index, deep)

    def summary(self) -> dict[str, Any]:
        """The report's summary figures over every step (the old per-list rules, same keys)."""
        with self._lock:
            for chosen in ((_STEADY,), (_STEADY, _SETTLING), (_STEADY, _SETTLING, _DEEP),
                           (_STEADY, _SETTLING, _DEEP, _WARMUP)):
                times = [t for c in chosen for t in self._times[c]]
                if times:
                    break
            else:
                return {"steps": 0}
            total = sum(times) or 1e-12
            phases = {k: sum(self._phases[c].get(k, 0.0) for c in chosen) / total for k in PHASES}
            return {"steps": self.count, "median_step_s": statistics.median(times),
                    "mean_step_s": total / len(times), "phase_share": phases, "last_loss": self.last_loss}
