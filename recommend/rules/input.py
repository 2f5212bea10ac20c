"""Input rule: data wait above 5% of the step. Its remedy tunes the script's own DataLoader
(``recommend/remedies/dataloader.py``: more workers, pinning on CUDA).

Evidence: the median light-step ``data_s`` phase against the step time.
"""

from __future__ import annotations

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.records.advice import Evidence

NAME = "input"
DATA_LOADING_SHARE = 0.05  # data wait above this share of the step deserves advice


def input_rule(profile: Profile) -> Finding | None:
    """Data loading above 5% of the step."""
    data, step = profile.phases.get("data_s"), profile.step_time_s
    if not data or not step or data <= DATA_LOADING_SHARE * step:
        return None
    share = data / step
    return Finding(
        rule=NAME,
        bottleneck="input",
        summary=f"waiting for data takes {share:.0%} of the step (median data wait over the median ordinary step)",
        severity=share,  # below any memory finding (>= 1)
        evidence=(Evidence(what="data wait / step time", value=round(share, 4), threshold=DATA_LOADING_SHARE),
                  Evidence(what="data wait per step", value=round(data, 6), unit="s")),
        no_remedy=None if profile.loaders else (
            "needs a torch DataLoader built under the advisor (none reported: a custom loader cannot be tuned)"),
    )


RULE = input_rule
