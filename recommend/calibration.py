"""Step-time calibration: how far each remedy's cost model missed on this session's applies.

After every apply the executor measures the step time with the remedy in force
(``ApplyResult.after.step_time_s``, the mean of the light steps at the end of its
window; a window timed on deep steps, ``step_kind`` "deep", is left out: predictions are for
ordinary steps) beside the cost model's prediction (``ApplyResult.predicted.step_time_s``). Per
remedy kind (``Recommendation.remedy``) this module keeps that history and the model's
relative error

    error = (predicted - measured) / measured      (+0.12: the model said 12% too slow)

and corrects later predictions of the same remedy with it:

- **shift**: the calibrated step time is ``predicted / (1 + e)``, ``e`` the median error of
  the remedy's applies (one error per apply: the median over its ranks), bounded by
  ``MAX_SHIFT_PER_APPLY`` for each apply that gave one: one window moves the calibration by at
  most 25% whatever it measured, so a noisy window ("489 ms → 98.8 ms", +992%) no longer turns the
  next prediction for a 235 ms job into 22.9 ms. A model that was 12% high once is taken to be
  12% high again; one that was 10x off is taken to be 25% off until more applies agree.
- **noisy windows** do not correct: a window whose light steps spread more than ``NOISY_SPREAD``
  of their mean (``(max - min) / mean``, read from the session's steps) measured noise as much
  as the remedy. Its error stays in the history, with its spread, and is left out of the shift.
- **widen**: the calibrated interval is spanned by ``predicted / (1 + e_i)`` over every
  error used (each bounded like the shift), so it holds what each past apply would have said.
  With fewer than ``TRUSTED_APPLIES`` applies one error says little about the next, so the
  interval also holds the uncorrected prediction: the shift is a guess until it repeats.

The model's own prediction (``predicted``) is never overwritten: errors are always measured
against it, so a correction never feeds on itself. Ranking uses the calibrated value.
Peak errors are recorded beside the step-time errors but correct nothing (the peak model is
a simulation of the measured step, and the budget check must see what it says).

Inputs are the session's apply history (``SessionState.applied``: ``ApplyResult``s and the
user's ``RevertResult``s), so the live advice loop, ``advisor report`` and ``advisor plan``
compute the same figures from the same records.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from advisor.records.advice import Calibration, Recommendation
from advisor.records.jsonable import to_json
from advisor.records.results import ApplyHistory, ApplyResult
from advisor.records.samples import StepSample

TRUSTED_APPLIES = 3  # below this many applies the interval keeps the uncorrected prediction
MAX_SHIFT_PER_APPLY = 0.25  # the most one apply's window moves the calibrated step time (relative error)
NOISY_SPREAD = 0.5  # (max - min) / mean of a window's light steps above which it corrects nothing


@dataclass(frozen=True, kw_only=True)
class ApplyError:
    """One apply of a remedy: predicted against measured (seconds, bytes) and the relative errors."""

    at_step: int | None
    ranks: tuple[int, ...]
    predicted_step_time_s: float | None
    measured_step_time_s: float | None
    step_time_error: float | None
    predicted_peak_bytes: int | None
    measured_peak_bytes: int | None
    peak_error: float | None
    # The window's light steps (every rank of the apply): how many, their shortest and longest time.
    measured_steps: int = 0
    measured_low_s: float | None = None
    measured_high_s: float | None = None

    @property
    def noisy(self) -> bool:
        """The window's steps spread too widely for its error to correct the model."""
        if self.measured_low_s is None or self.measured_high_s is None or not self.measured_step_time_s:
            return False
        return (self.measured_high_s - self.measured_low_s) / self.measured_step_time_s > NOISY_SPREAD

    def to_dict(self) -> dict[str, Any]:
        return {
            "at_step": self.at_step,
            "ranks": list(self.ranks),
            "predicted_step_time_s": to_json(self.predicted_step_time_s),
            "measured_step_time_s": to_json(self.measured_step_time_s),
            "measured_steps": self.measured_steps,
            "measured_low_s": to_json(self.measured_low_s),
            "measured_high_s": to_json(self.measured_high_s),
            "noisy": self.noisy,
            "step_time_error": to_json(self.step_time_error),
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "measured_peak_bytes": self.measured_peak_bytes,
            "peak_error": to_json(self.peak_error),
        }


@dataclass(frozen=True, kw_only=True)
class RemedyErrors:
    """A remedy kind's applies in this session and its models' median relative errors."""

    remedy: str
    applies: tuple[ApplyError, ...]

    @property
    def step_time_errors(self) -> list[float]:
        """The errors that correct the model: every apply timed on light steps, noisy windows left out."""
        return [a.step_time_error for a in self.applies if a.step_time_error is not None and not a.noisy]

    @property
    def step_time_error(self) -> float | None:
        errors = self.step_time_errors
        return statistics.median(errors) if errors else None

    @property
    def peak_error(self) -> float | None:
        errors = [a.peak_error for a in self.applies if a.peak_error is not None]
        return statistics.median(errors) if errors else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "remedy": self.remedy,
            "applies": len(self.applies),
            "step_time_error": to_json(self.step_time_error),
            "step_time_samples": len(self.step_time_errors),
            "noisy_windows": sum(1 for a in self.applies if a.noisy and a.step_time_error is not None),
            "peak_error": to_json(self.peak_error),
            "history": [a.to_dict() for a in self.applies],
        }


def _relative(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return (predicted - measured) / measured


def _median(values: list[float] | list[int]) -> float | None:
    return statistics.median(values) if values else None


def _window_times(entry: ApplyResult, steps: Mapping[int, Sequence[StepSample]] | None) -> list[float]:
    """The times of the light steps ``entry``'s after-window was timed on (the device's where the
    rank sent them), from the session's step records; empty without them."""
    if steps is None or not entry.after.time_steps:
        return []
    wanted = set(entry.after.time_steps)
    return [s.device_time_s if s.device_time_s is not None else s.time_s
            for s in steps.get(entry.rank, ()) if s.index in wanted and not s.deep]


def model_errors(applied: Iterable[ApplyHistory],
                 steps: Mapping[int, Sequence[StepSample]] | None = None) -> dict[str, RemedyErrors]:
    """Per remedy kind, its applies' errors in session order (failed applies and user reverts left out).

    The ranks of one apply (same remedy, same ``at_step``) make one entry: the median of
    their figures, so a wide job does not count one apply world-size times. ``steps`` (the
    session's ``StepSample``s by rank) gives each window's spread.
    """
    groups: dict[tuple[str, int | None], list[ApplyResult]] = {}
    for entry in applied:
        if not isinstance(entry, ApplyResult) or entry.status not in ("kept", "reverted"):
            continue  # failed: nothing ran; a RevertResult: a user's revert of a kept remedy
        groups.setdefault((entry.remedy, entry.at_step), []).append(entry)
    out: dict[str, list[ApplyError]] = {}
    for (remedy, at_step), entries in groups.items():
        p_time = _median([e.predicted.step_time_s for e in entries if e.predicted.step_time_s is not None])
        # Predictions are for ordinary (light) steps: a window timed on deep steps (the probes
        # running, 2-6x slower) says nothing about the model's error, so it is left out.
        m_time = _median([e.after.step_time_s for e in entries
                          if e.after.step_time_s is not None and (e.after.step_kind or "light") == "light"])
        p_peak = _median([e.predicted.peak_memory_bytes for e in entries if e.predicted.peak_memory_bytes is not None])
        m_peak = _median([e.after.peak_memory_bytes for e in entries if e.after.peak_memory_bytes is not None])
        window = [t for e in entries if (e.after.step_kind or "light") == "light" for t in _window_times(e, steps)]
        error = ApplyError(
            at_step=at_step, ranks=tuple(sorted(e.rank for e in entries)),
            predicted_step_time_s=p_time, measured_step_time_s=m_time, step_time_error=_relative(p_time, m_time),
            predicted_peak_bytes=None if p_peak is None else int(p_peak),
            measured_peak_bytes=None if m_peak is None else int(m_peak), peak_error=_relative(p_peak, m_peak),
            measured_steps=len(window), measured_low_s=min(window, default=None), measured_high_s=max(window, default=None))
        if error.step_time_error is not None or error.peak_error is not None:
            out.setdefault(remedy, []).append(error)
    return {remedy: RemedyErrors(remedy=remedy, applies=tuple(errors)) for remedy, errors in out.items()}


def calibrate(rec: Recommendation, errors: RemedyErrors | None) -> Recommendation:
    """``rec`` with its step time shifted and widened by its remedy's errors (unchanged without any)."""
    predicted = rec.predicted.step_time_s
    observed = errors.step_time_errors if errors is not None else []
    if predicted is None or not observed:
        return rec
    bound = MAX_SHIFT_PER_APPLY * len(observed)  # each window moves it by a bounded amount
    measured = statistics.median(observed)
    error = max(-bound, min(bound, measured))
    used = [max(-bound, min(bound, e)) for e in observed]
    candidates = [predicted / (1.0 + e) for e in used if e > -1.0]
    if len(observed) < TRUSTED_APPLIES:
        candidates.append(predicted)
    shifted = predicted / (1.0 + error) if error > -1.0 else predicted
    return replace(rec, calibration=Calibration(
        model_step_time_s=predicted, step_time_s=shifted, low_s=min(candidates + [shifted]),
        high_s=max(candidates + [shifted]), model_error=measured, shift_error=error, applies=len(observed)))


def calibrate_all(recs: Iterable[Recommendation], errors: Mapping[str, RemedyErrors]) -> list[Recommendation]:
    return [calibrate(rec, errors.get(rec.remedy)) for rec in recs]
