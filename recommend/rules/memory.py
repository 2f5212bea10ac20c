"""Memory rule: peak over 90% of the budget, or an OOM.

Its remedies are the ``recommend/remedies`` modules that address it: each proposes what fits its
own case (activation checkpointing, activation offload or a keep/recompute/offload mix when
activations dominate; optimizer-state offload and ZeRO when model states do; a pipeline split over
the devices one process sees), and the CPU-optimizer-step plan (a restart) when none of those fits.
``CONCLUDE`` then says when nothing fits the budget, the lowest peak a remedy reached, and what
would help beyond the advisor's remedies. Thresholds: REFERENCE.md ("Other remedies and their
signals").
"""

from __future__ import annotations

from dataclasses import replace

from advisor.recommend.finding import Finding, gib, largest_category, peak_categories
from advisor.recommend.memory_model import accumulates, measured_peak
from advisor.recommend.profile import Profile
from advisor.records.advice import Evidence

MEMORY_PRESSURE = 0.90  # peak above this share of the budget deserves advice
NAME = "memory"
# What helps when no remedy of the advisor fits (a smaller micro-batch is left out for a script that
# accumulates gradients already).
MORE_DEVICES = "more data-parallel ranks (ZeRO shards the model states over them) or devices (a pipeline splits the model)"
SMALLER_MICRO_BATCH = "a smaller micro-batch with gradient accumulation"


def budget_of(profile: Profile) -> int | None:
    """The budget the memory rule judges against: the profile's, else (no capacity recorded) what
    was allocated when the request failed, the best estimate of the capacity."""
    if profile.budget_bytes:
        return profile.budget_bytes
    if profile.oom is not None and profile.oom.categories:
        return sum(profile.oom.categories.values()) or None
    return None


def memory_rule(profile: Profile) -> Finding | None:
    """Peak over 90% of the budget, or an OOM."""
    budget = budget_of(profile)
    peak = measured_peak(profile)
    oom = profile.oom
    if oom is None and (not budget or peak <= MEMORY_PRESSURE * budget):
        return None
    cats = peak_categories(profile)
    largest = largest_category(profile)
    # After an OOM the step never reached its peak: the figure planned against is the measured one
    # plus the failed request and the model states a full step adds, so it is named apart from the
    # memory section's measured peak (a "peak memory" of 33.8 MiB beside a measured 22.1 MiB).
    what = ("peak memory the failed step needed (measured, plus its failed request and model states)"
            if oom is not None else "peak memory")
    evidence = [Evidence(what=what, value=peak, unit="bytes")]
    if budget:
        evidence.append(Evidence(what="peak / budget", value=round(peak / budget, 4), threshold=MEMORY_PRESSURE))
    if oom is not None:
        evidence.append(Evidence(what="out of memory",
                                 value=f"{oom.op or '?'} in {oom.module or '?'} asked for {gib(oom.requested_bytes or 0)}"))
        if profile.unreached_modules:
            names = profile.unreached_modules
            evidence.append(Evidence(what="modules the failed forward did not complete, sized as the last it did",
                                     value=", ".join(names) if len(names) <= 4 else f"{names[0]} … {names[-1]} ({len(names)})"))
    if largest:
        evidence.append(Evidence(what=f"largest category at peak: {largest}", value=cats[largest], unit="bytes"))
    summary = (f"out of memory in {oom.module or oom.op or 'the step'}" if oom is not None
               else f"peak {gib(peak)} is {peak / budget:.0%} of the {gib(budget)} budget")  # type: ignore[operator]
    severity = 2.0 if oom is not None else 1.0 + (peak / budget if budget else 0.0)
    return Finding(rule=NAME, bottleneck="memory", summary=summary, severity=severity, evidence=tuple(evidence),
                   budget_bytes=budget)


def conclude(profile: Profile, finding: Finding) -> Finding:
    """When nothing proposed fits the budget: why, the lowest peak reached, and what would help."""
    if finding.budget_bytes is None or finding.fits:
        return finding
    activations = largest_category(profile) == "activation"
    if activations and finding.lowest_peak_bytes is None:
        return finding  # checkpointing found nothing to change: the job fits as it is
    why = ("no set of checkpointed or offloaded modules fits the budget" if activations
           else "model states or other memory dominate, which checkpointing cannot reduce")
    helps = [MORE_DEVICES] + ([] if accumulates(profile) else [SMALLER_MICRO_BATCH])
    evidence = [Evidence(what="no remedy fits the budget", value=why)]
    if finding.lowest_peak_bytes is not None:
        evidence.append(Evidence(what="lowest peak a remedy reaches", value=finding.lowest_peak_bytes,
                                 threshold=finding.budget_bytes, unit="bytes"))
    evidence.append(Evidence(what="would help", value="; ".join(helps)))
    return replace(finding, evidence=finding.evidence + tuple(evidence))


RULE = memory_rule
CONCLUDE = conclude
