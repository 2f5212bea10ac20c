"""Entry point: a profile in, a diagnosis and ranked recommendations out.

The controller calls ``advise_report(report)`` (or ``advise(profile_from_memory(...))``)
whenever new deep-step data arrives and stores the dicts in ``SessionState``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from advisor.recommend.profile import Profile, profile_from_report
from advisor.records.advice import Diagnosis, Recommendation
from advisor.recommend.rules import RULES, Finding, Rule


def advise(profile: Profile, rules: Sequence[Rule] | None = None) -> tuple[Diagnosis, list[Recommendation]]:
    """Run the rules; the most severe finding names the bottleneck.

    Recommendations are ranked: those for the most severe finding first (a faster step is no
    remedy for a job that does not fit), then plans that fit, by predicted step time, then by
    predicted peak; ids are unique (first kept).
    """
    findings: list[Finding] = [f for rule in (RULES if rules is None else rules) if (f := rule(profile)) is not None]
    if not findings:
        diagnosis = Diagnosis(
            bottleneck="none",
            summary="no bottleneck found in what was measured",
            evidence=_headroom(profile),
        )
        return diagnosis, []
    findings.sort(key=lambda f: -f.severity)
    top = findings[0]
    evidence = list(top.evidence)
    for other in findings[1:]:
        evidence.append({"what": f"also: {other.bottleneck}", "value": other.summary})
    diagnosis = Diagnosis(bottleneck=top.bottleneck, summary=top.summary, evidence=evidence)
    recs: dict[str, Recommendation] = {}
    order: dict[str, int] = {}  # the remedies of the most severe finding come first
    for position, finding in enumerate(findings):
        for rec in finding.recommendations:
            recs.setdefault(rec.id, rec)
            order.setdefault(rec.id, position)
    return diagnosis, sorted(recs.values(), key=lambda r: (order[r.id], *_rank(r)))


def advise_report(report: Mapping[str, Any], *, budget_bytes: int | None = None) -> dict[str, Any]:
    """Re-advise a saved or live report: ``{"diagnosis": {...}, "recommendations": [...]}``."""
    diagnosis, recs = advise(profile_from_report(report, budget_bytes=budget_bytes))
    return {"diagnosis": diagnosis.to_dict(), "recommendations": [r.to_dict() for r in recs]}


def _rank(rec: Recommendation) -> tuple[int, float, float]:
    time = rec.predicted.step_time_s
    peak = rec.predicted.peak_memory_bytes
    return (
        0 if rec.fits else 1,
        time if time is not None else math.inf,
        float(peak) if peak is not None else math.inf,
    )


def _headroom(profile: Profile) -> list[dict[str, Any]]:
    if not profile.budget_bytes:
        return [{"what": "memory budget", "value": "unknown (no device capacity or --memory-budget)"}]
    return [{"what": "peak / budget", "value": round(profile.peak_bytes / profile.budget_bytes, 4), "threshold": 0.9}]
