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

    def __post_init__(self) -> None:
        _check(self.remedy, REMEDIES, "remedy")
        _check(self.confidence, CONFIDENCES, "confidence")

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
        }
