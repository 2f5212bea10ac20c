"""Straggler rule: one rank's step is slower than the others'; names the rank and the phase.

Evidence: ``Profile.rank_phases`` (each rank's median light-step time and phases). Ranks wait for
each other inside the gradient all-reduce, so step times even out and the backward phase holds
the wait: ranks are compared on their own work, the phases other than backward (data, forward,
optimizer, other). A rank whose own work takes ``STRAGGLER_RATIO`` times the fastest rank's, and
at least ``MIN_STEP_SHARE`` of the step more, fires; the phase that makes it slow is the one
whose time exceeds the fastest rank's by the most. No remedy is built for it: the finding says what
would be needed (balancing that phase's work across ranks).
"""

from __future__ import annotations

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile, RankPhases
from advisor.recommend.rules._figures import ms
from advisor.records.advice import Evidence

NAME = "straggler"

STRAGGLER_RATIO = 1.2  # slowest rank's own work / fastest rank's above this: a straggler
MIN_STEP_SHARE = 0.05  # and the difference is at least this share of the step
OWN_WORK = ("data_s", "forward_s", "optimizer_s", "other_s")


def _work(rank: RankPhases) -> float:
    return sum(rank.phases.get(k, 0.0) for k in OWN_WORK)


def straggler_rule(profile: Profile) -> Finding | None:
    ranks = {r: p for r, p in profile.rank_phases.items() if _work(p) > 0 and p.time_s}
    if len(ranks) < 2:
        return None
    slow = max(ranks, key=lambda r: (_work(ranks[r]), -r))
    fast = min(ranks, key=lambda r: (_work(ranks[r]), r))
    ratio = _work(ranks[slow]) / _work(ranks[fast])
    lost = _work(ranks[slow]) - _work(ranks[fast])
    step = ranks[slow].time_s
    if ratio <= STRAGGLER_RATIO or lost < MIN_STEP_SHARE * step:
        return None
    phase = max(OWN_WORK, key=lambda k: (ranks[slow].phases.get(k, 0.0) - ranks[fast].phases.get(k, 0.0), k))
    extra = ranks[slow].phases.get(phase, 0.0) - ranks[fast].phases.get(phase, 0.0)
    name = phase.removesuffix("_s")
    return Finding(
        rule=NAME,
        bottleneck="communication",
        summary=f"rank {slow} is a straggler: its own work takes {ratio:.2f}x rank {fast}'s, "
                f"{ms(extra)} more in {name}",
        severity=lost / step,
        evidence=(
            Evidence(what=f"rank {slow} own work / rank {fast} own work (data+forward+optimizer+other)",
                     value=round(ratio, 4), threshold=STRAGGLER_RATIO),
            Evidence(what=f"rank {slow} {name} - rank {fast} {name}", value=round(extra, 6), unit="s"),
        ),
        no_remedy=f"needs the {name} work balanced across ranks (e.g. equal shards, the same data pipeline per rank)",
    )


RULE = straggler_rule
