"""Entry point: a profile in, a diagnosis and ranked recommendations out.

The controller calls ``advise(profile_from_records(...))`` through
``advisor.advice.advise_state``, the one path the live loop, ``advisor report``
and ``advisor plan`` share, and keeps the typed records in ``SessionState``.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from advisor.recommend.calibration import RemedyErrors, calibrate
from advisor.recommend.profile import Profile
from advisor.recommend.rules import RULES, Finding, Rule
from advisor.records.advice import Diagnosis, Evidence, Recommendation


def advise(profile: Profile, rules: Sequence[Rule] | None = None,
           errors: Mapping[str, RemedyErrors] | None = None) -> tuple[Diagnosis, list[Recommendation]]:
    """Run the rules; the most severe finding names the bottleneck.

    Recommendations are ranked by the severity of the finding that proposed them (the
    bottleneck that blocks the run or costs the most comes first: an over-budget job's memory
    remedies before a faster optimizer), then plans that fit first, by predicted step time
    (calibrated by ``errors``, the session's earlier applies per remedy, where there are
    any: ``recommend/calibration.py``), then by predicted peak; ids are unique (first kept).
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
        evidence.append(Evidence(what=f"also: {other.bottleneck}", value=other.summary))
    diagnosis = Diagnosis(bottleneck=top.bottleneck, summary=top.summary, evidence=tuple(evidence))
    recs: dict[str, tuple[int, Recommendation]] = {}
    for order, finding in enumerate(findings):
        for rec in finding.recommendations:
            recs.setdefault(rec.id, (order, rec))
    if errors:
        recs = {key: (order, calibrate(rec, errors.get(rec.remedy))) for key, (order, rec) in recs.items()}
    return diagnosis, [rec for _, rec in sorted(recs.values(), key=lambda pair: _rank(*pair))]



def _rank(order: int, rec: Recommendation) -> tuple[int, int, int, float, float]:
    time = rec.calibration.step_time_s if rec.calibration is not None else rec.predicted.step_time_s
    peak = rec.predicted.peak_memory_bytes
    return (
        0 if rec.applicable else 1,  # what cannot apply to this job comes last, with its reason
        order,
        0 if rec.fits else 1,
        time if time is not None else math.inf,
        float(peak) if peak is not None else math.inf,
    )


def _headroom(profile: Profile) -> tuple[Evidence, ...]:
    if not profile.budget_bytes:
        return (Evidence(what="memory budget", value="unknown (no device capacity or --memory-budget)"),)
    return (Evidence(what="peak / budget", value=round(profile.peak_bytes / profile.budget_bytes, 4), threshold=0.9),)
