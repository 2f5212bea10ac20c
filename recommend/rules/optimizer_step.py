"""Optimizer-step rule: the optimizer step takes over ``OPTIMIZER_SHARE`` of the step.

Evidence: the median light-step ``optimizer_s`` phase against the step time. The launch cost of
many small optimizer kernels (one per op per tensor list with foreach kernels) is the usual cause,
so the finding is ``launch_overhead``; its remedy is fused optimizer kernels
(``recommend/remedies/fused_optimizer.py``).
"""

from __future__ import annotations

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.records.advice import Evidence

NAME = "optimizer_step"
OPTIMIZER_SHARE = 0.25  # optimizer step above this share of the step time deserves advice


def optimizer_step_rule(profile: Profile) -> Finding | None:
    opt, step = profile.phases.get("optimizer_s"), profile.step_time_s
    if not opt or not step or opt <= OPTIMIZER_SHARE * step:
        return None
    share = opt / step
    return Finding(rule=NAME, bottleneck="launch_overhead", summary=f"the optimizer step takes {share:.0%} of the step",
                   severity=share / 2,  # below memory (>= 1) and an input stall of the same share
                   evidence=(Evidence(what="optimizer step / step time", value=round(share, 4),
                                      threshold=OPTIMIZER_SHARE),))


RULE = optimizer_step_rule
