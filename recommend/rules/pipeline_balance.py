"""Pipeline balance: a live pipeline split whose measured stage times are imbalanced (issue 12, the
rule's second part). The remedy that proposes a new split, with its predicted gain, is the pipeline
(``recommend/remedies/pipeline_repartition.py`` holds the calibration and the gain threshold); an
imbalanced split with no better one is no finding.

Evidence: ``Profile.pipeline``, the last ``pipeline_stages`` event of a split in force: each stage's
measured forward seconds per pipelined forward; imbalance = slowest / mean, from ``IMBALANCE``.
"""

from __future__ import annotations

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.recommend.remedies.pipeline_repartition import IMBALANCE
from advisor.records.advice import Evidence
from advisor.records.units import fmt_seconds

NAME = "pipeline_balance"


def pipeline_balance_rule(profile: Profile) -> Finding | None:
    info = profile.pipeline
    if info is None:
        return None
    times = list(info.stage_times_s)
    if len(info.stages) < 2 or len(times) != len(info.stages) or min(times) <= 0:
        return None  # no forward measured since the split (or its last change)
    mean = sum(times) / len(times)
    imbalance = max(times) / mean
    if imbalance < IMBALANCE:
        return None
    return Finding(rule=NAME, bottleneck="compute", severity=0.5 + imbalance - 1.0, needs_remedy=True,
                   summary=f"pipeline stages imbalanced: the slowest takes {imbalance:.2f}x the mean",
                   evidence=(Evidence(what="stage forward seconds (measured)",
                                      value=", ".join(fmt_seconds(t) for t in times)),))


RULE = pipeline_balance_rule
