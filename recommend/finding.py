"""What a rule concludes: a bottleneck with its evidence and candidate remedies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from advisor.records.advice import Recommendation
from advisor.records.units import fmt_bytes

if TYPE_CHECKING:  # pragma: no cover
    from advisor.recommend.profile import Profile


@dataclass(frozen=True, kw_only=True)
class Finding:
    """What one rule concluded. ``severity`` orders findings: the highest names the bottleneck."""

    bottleneck: str
    summary: str
    severity: float
    evidence: list[dict[str, object]] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "bottleneck": self.bottleneck,
            "summary": self.summary,
            "severity": self.severity,
            "evidence": list(self.evidence),
            "recommendations": [r.to_dict() for r in self.recommendations],
        }


Rule = Callable[["Profile"], "Finding | None"]


def gib(n: int | float) -> str:
    return fmt_bytes(n)  # the one unit style of every surface (advisor.records.units)


def largest_category(profile: "Profile") -> str | None:
    """The memory category holding the most bytes at the peak (at the failed request after an
    OOM); None when nothing was measured. Memory remedies use it to judge their own case."""
    cats = dict(profile.categories_at_peak or profile.categories_max)
    if profile.oom and profile.oom.get("categories"):
        cats = {k: int(v) for k, v in profile.oom["categories"].items()}
    return max(cats, key=lambda k: cats[k]) if cats else None
