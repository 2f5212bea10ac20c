"""What the recommender hands to the report, the TUI and the apply executor.

Frozen keyword-only dataclasses whose ``to_dict()`` gives exactly the keys of
the report contract (docs/report-schema.md): ``diagnosis {bottleneck, summary,
evidence}`` and ``recommendations [{id, remedy, title, params, predicted,
baseline, ...}]``. Pure standard library: ``recommend/`` never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from advisor.records.jsonable import to_json

BOTTLENECKS: tuple[str, ...] = ("memory", "compute", "communication", "input", "launch_overhead", "none")

# Remedies the apply/ package can execute today, and the ones we only point to.
BUILT_REMEDIES: tuple[str, ...] = ("activation_checkpointing",)
REMEDIES: tuple[str, ...] = BUILT_REMEDIES + (
    "cpu_offload",
    "zero",
    "pipeline",
    "mixed_precision",
    "micro_batch",
    "not_built",
)
CONFIDENCES: tuple[str, ...] = ("high", "medium", "low")
_REGISTERED: set[str] = set()  # remedy names declared by recommend/remedies/*.py (RemedySpec)

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


def register_remedy(name: str) -> None:
    """Make ``name`` a valid ``Recommendation.remedy`` (each remedy's spec calls this on import)."""
    if not name.isidentifier():
        raise ValueError(f"remedy name {name!r} must be a Python identifier (it names apply_<name>)")
    _REGISTERED.add(name)


def remedy_names() -> tuple[str, ...]:
    return REMEDIES + tuple(sorted(_REGISTERED - set(REMEDIES)))


def _check(value: str, valid: tuple[str, ...], what: str) -> None:
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """Peak memory (bytes) and step time (seconds); None where the model cannot say."""

    peak_memory_bytes: int | None
    step_time_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"peak_memory_bytes": self.peak_memory_bytes, "step_time_s": to_json(self.step_time_s)}


@dataclass(frozen=True, kw_only=True)
class CurvePoint:
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
class Calibration:
    """A prediction corrected by how far the same remedy's cost model missed on this session's
    applies (``recommend/calibration.py``): seconds, and the model's median relative error
    ``(predicted - measured) / measured`` over ``applies`` applies."""

    model_step_time_s: float  # the cost model's prediction, as in ``Recommendation.predicted``
    step_time_s: float  # shifted: model / (1 + model_error)
    low_s: float  # the interval the past applies' errors (and, with few, the model itself) span
    high_s: float
    model_error: float
    applies: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_step_time_s": to_json(self.model_step_time_s),
            "step_time_s": to_json(self.step_time_s),
            "low_s": to_json(self.low_s),
            "high_s": to_json(self.high_s),
            "model_error": to_json(self.model_error),
            "applies": self.applies,
        }


@dataclass(frozen=True, kw_only=True)
class Diagnosis:
    """The bottleneck class and the measurements that point to it.

    ``evidence`` items are ``{"what", "value", "threshold"?, "unit"?}``.
    """

    bottleneck: str
    summary: str
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(self.bottleneck, BOTTLENECKS, "bottleneck")

    def to_dict(self) -> dict[str, Any]:
        return {"bottleneck": self.bottleneck, "summary": self.summary, "evidence": to_json(self.evidence)}


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """One remedy with chosen parameters and its predicted effect against the measured baseline.

    ``params`` is what the executor needs: for activation checkpointing
    ``{"modules": [qualified names]}``. ``exact``: the remedy leaves numerics
    unchanged. ``live``: it can be applied to the running job at a step boundary.
    ``apply_class``: one of ``APPLY_CLASSES``; when not given it follows from ``live`` and
    ``exact`` (live and exact: live-exact; live, not exact: live-opt-in; else restart).
    """

    id: str
    remedy: str
    title: str
    params: dict[str, Any]
    predicted: Prediction
    baseline: Prediction
    cost_model: str
    confidence: str
    exact: bool
    live: bool
    prerequisites: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    curve: list[CurvePoint] | None = None
    fits: bool = True  # False: the best plan this remedy has still exceeds the budget
    apply_class: str | None = None
    calibration: Calibration | None = None  # set from the session's earlier applies of this remedy
    # For a plan over a chain of blocks: every block in forward order with the option it got,
    # {"name", "choice": "keep" | "recompute" | "offload"} (empty for other remedies).
    block_plan: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(self.remedy, remedy_names(), "remedy")
        _check(self.confidence, CONFIDENCES, "confidence")
        if self.apply_class is None:
            derived = ("live-exact" if self.exact else "live-opt-in") if self.live else "restart"
            object.__setattr__(self, "apply_class", derived)
        else:
            parse_apply_class(self.apply_class)

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
            "apply_class": self.apply_class,
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "block_plan": [dict(b) for b in self.block_plan],
        }
