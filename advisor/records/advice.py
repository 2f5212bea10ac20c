"""What the recommender hands to the report, the TUI and the apply executor.

Frozen keyword-only dataclasses whose ``to_dict()`` gives exactly the keys of
the report contract (docs/report-schema.md): ``diagnosis {bottleneck, summary,
evidence}`` and ``recommendations [{id, remedy, title, params, predicted,
baseline, ...}]``; ``from_dict`` decodes them back with every field checked
(``advisor.records.jsonable.decode``): a recommendation crosses to the training
process inside an ``ApplyCommand``. Pure standard library: ``recommend/``
never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.records.jsonable import Checked, to_json

BOTTLENECKS: tuple[str, ...] = ("memory", "compute", "communication", "input", "launch_overhead", "none")
CONFIDENCES: tuple[str, ...] = ("high", "medium", "low")

# How a remedy may reach the running job (docs/report-schema.md, docs/architecture.md "Acting"):
APPLY_CLASSES: tuple[str, ...] = (
    "live-exact",  # applied at a step boundary; same numerics (e.g. non-reentrant checkpointing)
    "live-equivalent",  # applied live; floating-point reassociation only (e.g. fused optimizer kernels)
    "live-opt-in",  # applied live but changes numerics: --allow-inexact headless, a confirmation in the TUI
    "restart",  # written into a plan, applied at the next `advisor attach --plan`
)


def parse_apply_class(value: str) -> str:
    """``value`` if it names an apply class, else ``ValueError`` naming the valid ones."""
    if value not in APPLY_CLASSES:
        raise ValueError(f"unknown apply class {value!r}; valid: {', '.join(APPLY_CLASSES)}")
    return value


def parse_remedy_name(name: str) -> str:
    """``name`` if it can name a remedy (a Python identifier: it names ``apply_<name>``), else
    ``ValueError``. Which remedies exist is the recommender's (``recommend/remedies``) and the
    applier's (``apply/registry.py``) to say, each on its side of the process boundary."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"remedy name {name!r} must be a Python identifier (it names apply_<name>)")
    return name


def fits_budget(peak_bytes: int | None, budget_bytes: int | None) -> bool:
    """Whether a predicted peak fits a budget: always without a budget, never without a peak.

    The one place this is decided: a remedy that says nothing of memory (a faster kernel, a
    communication hook) does not fit a budget, since nothing says it would not exceed it; one
    that leaves memory as it is predicts the measured peak."""
    if budget_bytes is None:
        return True
    return peak_bytes is not None and peak_bytes <= budget_bytes


def _check(value: str, valid: tuple[str, ...], what: str) -> None:
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")


@dataclass(frozen=True, kw_only=True)
class Prediction(Checked):
    """Peak memory (bytes) and step time (seconds); None where the model cannot say."""

    peak_memory_bytes: int | None
    step_time_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"peak_memory_bytes": self.peak_memory_bytes, "step_time_s": to_json(self.step_time_s)}


@dataclass(frozen=True, kw_only=True)
class CurvePoint(Checked):
    """One point of a remedy's memory/time trade-off: the best plan under ``budget_bytes``."""

    budget_bytes: int
    overhead_s: float
    peak_memory_bytes: int
    modules_count: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget_bytes,
            "overhead_s": to_json(self.overhead_s),
            "peak_memory_bytes": self.peak_memory_bytes,
            "modules_count": self.modules_count,
        }


@dataclass(frozen=True, kw_only=True)
class Calibration(Checked):
    """A prediction corrected by how far the same remedy's cost model missed on this session's
    applies (``recommend/calibration.py``): seconds, and the model's median relative error
    ``(predicted - measured) / measured`` over ``applies`` applies."""

    model_step_time_s: float  # the cost model's prediction, as in ``Recommendation.predicted``
    step_time_s: float  # shifted: model / (1 + shift_error)
    low_s: float  # the interval the past applies' errors (and, with few, the model itself) span
    high_s: float
    model_error: float  # the median error measured
    applies: int
    # The error the shift uses: ``model_error`` bounded by 25% per apply (one window moves the
    # calibration by a bounded amount); None in records from before the bound, where it is model_error.
    shift_error: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_step_time_s": to_json(self.model_step_time_s),
            "step_time_s": to_json(self.step_time_s),
            "low_s": to_json(self.low_s),
            "high_s": to_json(self.high_s),
            "model_error": to_json(self.model_error),
            "shift_error": to_json(self.model_error if self.shift_error is None else self.shift_error),
            "applies": self.applies,
        }


@dataclass(frozen=True, kw_only=True)
class Evidence(Checked):
    """One measurement behind a diagnosis: what, its value, and the threshold it crossed (same unit)."""

    what: str
    value: int | float | str | None
    threshold: int | float | None = None
    unit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"what": self.what, "value": to_json(self.value)}
        if self.threshold is not None:
            out["threshold"] = to_json(self.threshold)
        if self.unit is not None:
            out["unit"] = self.unit
        return out


@dataclass(frozen=True, kw_only=True)
class StepSpan(Checked):
    """The first and last step (indexes) a figure describes."""

    first: int
    last: int

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "last": self.last}


@dataclass(frozen=True, kw_only=True)
class Diagnosis(Checked):
    """The bottleneck class and the measurements that point to it.

    ``steps``: the steps the advice describes (the lowest rank's, of the regime read); the report,
    the TUI and ``advisor check`` compare its figures with the section or regime showing them."""

    bottleneck: str
    summary: str
    evidence: tuple[Evidence, ...] = ()
    steps: StepSpan | None = None

    def __post_init__(self) -> None:
        _check(self.bottleneck, BOTTLENECKS, "bottleneck")

    def to_dict(self) -> dict[str, Any]:
        out = {"bottleneck": self.bottleneck, "summary": self.summary, "evidence": [e.to_dict() for e in self.evidence]}
        if self.steps is not None:
            out["steps"] = self.steps.to_dict()
        return out


BLOCK_CHOICES: tuple[str, ...] = ("keep", "recompute", "offload")


@dataclass(frozen=True, kw_only=True)
class BlockChoice(Checked):
    """One block of a plan over a chain, in forward order, and what the plan does with it."""

    name: str
    choice: str

    def __post_init__(self) -> None:
        _check(self.choice, BLOCK_CHOICES, "block choice")


@dataclass(frozen=True, kw_only=True)
class PlanPart(Checked):
    """One remedy of a joint plan (``recommend/remedies/joint_plan.py``): what it applies, and its
    predicted effect applied alone (the figures of the whole are the recommendation's own)."""

    id: str  # as the part would be named alone: "zero-3", "checkpoint-layers-2"
    remedy: str
    params: dict[str, Any]
    predicted: Prediction
    apply_class: str

    def __post_init__(self) -> None:
        parse_remedy_name(self.remedy)
        parse_apply_class(self.apply_class)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "remedy": self.remedy, "params": to_json(self.params),
                "predicted": self.predicted.to_dict(), "apply_class": self.apply_class}


@dataclass(frozen=True, kw_only=True)
class Recommendation(Checked):
    """One remedy with chosen parameters and its predicted effect against the measured baseline.

    ``params`` is what the executor needs: for activation checkpointing
    ``{"modules": [qualified names]}``. ``exact``: the remedy leaves numerics
    unchanged. ``live``: it can be applied to the running job at a step boundary.
    ``apply_class``: one of ``APPLY_CLASSES``; when not given it follows from ``live`` and
    ``exact`` (live and exact: live-exact; live, not exact: live-opt-in; else restart).
    ``budget_bytes``: the memory budget it was judged against (None: none known); whether it
    ``fits`` follows from it and the predicted peak (``fits_budget``), never from a flag; ``from_dict``
    therefore does not read the ``fits`` key.
    """

    id: str
    remedy: str
    title: str
    params: dict[str, Any]
    predicted: Prediction
    baseline: Prediction
    budget_bytes: int | None
    cost_model: str
    confidence: str
    exact: bool
    live: bool
    prerequisites: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    curve: tuple[CurvePoint, ...] | None = None
    apply_class: str | None = None
    calibration: Calibration | None = None  # set from the session's earlier applies of this remedy
    # For a plan over a chain of blocks: every block in forward order with the option it got
    # (empty for other remedies).
    block_plan: tuple[BlockChoice, ...] = ()
    # Whether the remedy can apply to this job, as its check in the training process answered
    # (``check_<name>``, advisor/apply/registry.py), and why not: listed, never applied or chosen.
    applicable: bool = True
    why: str | None = None
    # A joint plan's remedies in the order they apply, each with its prediction alone (empty for
    # a single remedy).
    parts: tuple[PlanPart, ...] = ()

    def __post_init__(self) -> None:
        parse_remedy_name(self.remedy)
        _check(self.confidence, CONFIDENCES, "confidence")
        for name in ("prerequisites", "evidence", "block_plan", "parts"):  # lists from callers; the record keeps tuples
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.curve is not None:
            object.__setattr__(self, "curve", tuple(self.curve))
        if self.apply_class is None:
            derived = ("live-exact" if self.exact else "live-opt-in") if self.live else "restart"
            object.__setattr__(self, "apply_class", derived)
        else:
            parse_apply_class(self.apply_class)

    @property
    def fits(self) -> bool:
        """Whether the predicted peak fits the budget (False when it exceeds it, or when there is a
        budget and no predicted peak)."""
        return fits_budget(self.predicted.peak_memory_bytes, self.budget_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "remedy": self.remedy,
            "title": self.title,
            "params": to_json(self.params),
            "predicted": self.predicted.to_dict(),
            "baseline": self.baseline.to_dict(),
            "cost_model": self.cost_model,
            "confidence": self.confidence,
            "exact": self.exact,
            "live": self.live,
            "prerequisites": list(self.prerequisites),
            "evidence": list(self.evidence),
            "curve": None if self.curve is None else [p.to_dict() for p in self.curve],
            "fits": self.fits,
            "budget_bytes": self.budget_bytes,
            "apply_class": self.apply_class,
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "block_plan": [b.to_dict() for b in self.block_plan],
            "applicable": self.applicable,
            "why": self.why,
            "parts": [p.to_dict() for p in self.parts],
        }
