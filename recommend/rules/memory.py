"""Memory rule: peak over 90% of the budget, or an OOM. It asks every memory remedy for a plan.

Memory remedies are the ``recommend/remedies`` modules whose spec says ``addresses="memory"``;
each proposes what fits: activation checkpointing, activation offload or a keep/recompute/offload
mix when activations dominate (the joint solver in ``remedies/offload.py``), optimizer-state
offload when model states do. When no live plan fits, the CPU-optimizer-step plan (a restart)
and a not-built note name what would. Thresholds: REFERENCE.md ("Other remedies and their
signals").
"""

from __future__ import annotations

from advisor.recommend import remedies
from advisor.recommend.finding import Finding, gib
from advisor.recommend.memory_model import accumulates, measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies.optimizer_offload import cpu_step_plan
from advisor.records.advice import Prediction, Recommendation

MEMORY_PRESSURE = 0.90  # peak above this share of the budget deserves advice
NOT_BUILT = (
    "more data-parallel ranks, to shard the model states with ZeRO (remedies/zero.py shards a DDP job's)",
    "a smaller micro-batch with gradient accumulation",
    "more devices, to split the model into a pipeline",
)
NOT_BUILT_IDS = ("zero", "micro_batch", "pipeline")
_MICRO_BATCH = NOT_BUILT_IDS.index("micro_batch")


def memory_rule(profile: Profile) -> Finding | None:
    """Peak over 90% of the budget, or an OOM: checkpointing when activations dominate."""
    budget = profile.budget_bytes
    if not budget and profile.oom and profile.oom.get("categories"):
        # No capacity recorded: what was allocated when the request failed is the best estimate of it.
        budget = sum(int(v) for v in profile.oom["categories"].values()) or None
    peak = measured_peak(profile)
    if not profile.oom and (not budget or peak <= MEMORY_PRESSURE * budget):
        return None
    cats = dict(profile.categories_at_peak or profile.categories_max)
    if profile.oom and profile.oom.get("categories"):
        cats = {k: int(v) for k, v in profile.oom["categories"].items()}
    largest = max(cats, key=lambda k: cats[k]) if cats else None
    # After an OOM the step never reached its peak: the figure planned against is the measured one
    # plus the failed request and the model states a full step adds, so it is named apart from the
    # memory section's measured peak (a "peak memory" of 33.8 MiB beside a measured 22.1 MiB).
    what = "peak memory the failed step needed (measured, plus its failed request and model states)" if profile.oom \
        else "peak memory"
    evidence: list[dict[str, object]] = [{"what": what, "value": peak, "unit": "bytes"}]
    if budget:
        evidence.append({"what": "peak / budget", "value": round(peak / budget, 4), "threshold": MEMORY_PRESSURE})
    if profile.oom:
        oom = profile.oom
        evidence.append({"what": "out of memory",
                         "value": f"{oom.get('op') or '?'} in {oom.get('module') or '?'} asked for {gib(oom.get('requested_bytes') or 0)}"})
        if profile.unreached_modules:
            names = profile.unreached_modules
            evidence.append({"what": "modules the failed forward did not complete, sized as the last it did",
                             "value": ", ".join(names) if len(names) <= 4 else f"{names[0]} … {names[-1]} ({len(names)})"})
    if largest:
        evidence.append({"what": f"largest category at peak: {largest}", "value": cats[largest], "unit": "bytes"})
    summary = (f"out of memory in {profile.oom.get('module') or profile.oom.get('op') or 'the step'}" if profile.oom
               else f"peak {gib(peak)} is {peak / budget:.0%} of the {gib(budget)} budget")
    recs: list[Recommendation] = []
    if budget:
        # Every memory remedy judges its own case (checkpointing when activations dominate,
        # ZeRO when a data-parallel job replicates its optimizer state, ...).
        for spec in remedies.specs().values():
            if spec.addresses == "memory" and spec.propose is not None:
                recs += spec.propose(profile, budget, evidence)
    # Nothing live fits: the CPU-optimizer-step plan (a restart) and a note on what would. When
    # activations dominate, a remedy that found nothing to change leaves no "lowest peak".
    if not any(r.fits for r in recs) and (largest != "activation" or not _fits_already(evidence)):
        why = ("no set of checkpointed or offloaded modules fits the budget" if largest == "activation"
               else "model states or other memory dominate, which checkpointing cannot reduce")
        recs += _nothing_live_fits(profile, budget, _lowest_peak(evidence) if largest == "activation" else None, why)
    severity = 2.0 if profile.oom else 1.0 + (peak / budget if budget else 0.0)
    return Finding(bottleneck="memory", summary=summary, severity=severity, evidence=evidence, recommendations=recs)


def _nothing_live_fits(profile: Profile, budget: int | None, best: int | None, why: str) -> list[Recommendation]:
    """The CPU-optimizer-step plan (a restart) when it exists, then the not-built note."""
    plan = cpu_step_plan(profile, budget) if budget else None
    return ([plan] if plan is not None else []) + [_not_built(profile, budget, best, why)]


def _lowest_peak(evidence: list[dict[str, object]]) -> int | None:
    for item in evidence:
        if item.get("what") == "lowest peak with activation checkpointing":
            value = item.get("value")
            return value if isinstance(value, int) else None
    return None


def _fits_already(evidence: list[dict[str, object]]) -> bool:
    """A remedy found nothing to change (the job fits) when it left no 'lowest peak' evidence."""
    return not any(item.get("what") == "lowest peak with activation checkpointing" for item in evidence)


def _not_built(profile: Profile, budget: int | None, best_peak: int | None, why: str) -> Recommendation:
    """Says plainly that nothing built fits, and which remedies would (not built yet). A script
    that already accumulates gradients is not told to accumulate them."""
    keep = [i for i in range(len(NOT_BUILT)) if not (i == _MICRO_BATCH and accumulates(profile))]
    return Recommendation(
        id="memory-not-built",
        remedy="not_built",
        title=f"No built remedy fits the memory budget ({why}); consider: " + "; ".join(NOT_BUILT[i] for i in keep),
        params={"remedies": [NOT_BUILT_IDS[i] for i in keep]},
        predicted=Prediction(peak_memory_bytes=best_peak, step_time_s=None),
        baseline=Prediction(peak_memory_bytes=measured_peak(profile), step_time_s=profile.step_time_s),
        cost_model="none",
        confidence="low",
        exact=False,
        live=False,
        prerequisites=["not built yet in this advisor"],
        evidence=[why] + ([f"lowest peak with activation checkpointing: {gib(best_peak)}"] if best_peak else [])
        + ([f"budget {gib(budget)}"] if budget else []),
        fits=False,
    )


RULE = memory_rule
