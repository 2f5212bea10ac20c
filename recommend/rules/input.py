"""Input rule: data loading above 5% of the step (no remedy built yet: the diagnosis says so)."""

from __future__ import annotations

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile

DATA_LOADING_SHARE = 0.05  # data wait above this share of the step deserves advice


def input_rule(profile: Profile) -> Finding | None:
    """Data loading above 5% of the step."""
    data, step = profile.phases.get("data_s"), profile.step_time_s
    if not data or not step or data <= DATA_LOADING_SHARE * step:
        return None
    share = data / step
    return Finding(
        bottleneck="input",
        summary=f"waiting for data takes {share:.0%} of the step",
        severity=share,  # below any memory finding (>= 1)
        evidence=[{"what": "data wait / step time", "value": round(share, 4), "threshold": DATA_LOADING_SHARE}],
    )


RULE = input_rule
