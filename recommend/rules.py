"""Rules: each reads a ``Profile`` and returns a ``Finding`` (a bottleneck with evidence and
candidate remedies) or None. ``advise`` runs the registry ``RULES``; add a rule by
appending a function with the ``Rule`` signature.

Thresholds come from REFERENCE.md ("Other remedies and their signals").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from advisor.recommend.checkpoint import Plan, solve_chain, tradeoff_curve, greedy_tree
from advisor.recommend.memory_model import COST_MODEL, Chain, accumulates, chain_from_profile, measured_peak
from advisor.recommend.profile import Profile
from advisor.records.advice import Prediction, Recommendation

MEMORY_PRESSURE = 0.90  # peak above this share of the budget deserves advice
DATA_LOADING_SHARE = 0.05  # data wait above this share of the step deserves advice
NOT_BUILT = (
    "CPU offload of activations or optimizer state",
    "ZeRO / FSDP sharding of model states",
    "a smaller micro-batch with gradient accumulation",
    "a pipeline split across devices",
)
NOT_BUILT_IDS = ("cpu_offload", "zero", "micro_batch", "pipeline")
_MICRO_BATCH = NOT_BUILT_IDS.index("micro_batch")


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


Rule = Callable[[Profile], "Finding | None"]


def _gib(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB"


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
    evidence: list[dict[str, object]] = [{"what": "peak memory", "value": peak, "unit": "bytes"}]
    if budget:
        evidence.append({"what": "peak / budget", "value": round(peak / budget, 4), "threshold": MEMORY_PRESSURE})
    if profile.oom:
        oom = profile.oom
        evidence.append({"what": "out of memory",
                         "value": f"{oom.get('op') or '?'} in {oom.get('module') or '?'} asked for {oom.get('requested_bytes')} bytes"})
    if largest:
        evidence.append({"what": f"largest category at peak: {largest}", "value": cats[largest], "unit": "bytes"})
    summary = (f"out of memory in {profile.oom.get('module') or profile.oom.get('op') or 'the step'}" if profile.oom
               else f"peak {_gib(peak)} is {peak / budget:.0%} of the {_gib(budget)} budget")
    recs: list[Recommendation] = []
    if largest == "activation" and budget:
        recs = _checkpointing(profile, budget, evidence)
    else:
        evidence.append({"what": "activation checkpointing", "value": "not proposed: activations are not the largest category"})
        recs = [_not_built(profile, budget, None, "model states or other memory dominate, which checkpointing cannot reduce")]
    severity = 2.0 if profile.oom else 1.0 + (peak / budget if budget else 0.0)
    return Finding(bottleneck="memory", summary=summary, severity=severity, evidence=evidence, recommendations=recs)


def _checkpointing(profile: Profile, budget: int, evidence: list[dict[str, object]]) -> list[Recommendation]:
    """The least-recompute plan under 90% of the budget, else under the budget, else a not-built note."""
    chain = chain_from_profile(profile)
    target = int(MEMORY_PRESSURE * budget)
    plan: Plan | None = None
    units: Chain | None = chain
    if chain is not None:
        plan = solve_chain(chain, target)
        if not plan.feasible:
            plan = solve_chain(chain, budget)
    if plan is None or not plan.feasible:
        tree = greedy_tree(profile, target)  # adds modules until the target holds, or none is left
        if tree is not None and tree[1].peak_bytes <= budget:
            units, plan = tree
    if plan is None or not plan.feasible or units is None:
        best = plan.peak_bytes if plan is not None else None
        evidence.append({"what": "lowest peak with activation checkpointing", "value": best, "unit": "bytes", "threshold": budget})
        return [_not_built(profile, budget, best, "no set of checkpointed modules fits the budget")]
    if not plan.modules:
        return []  # the job already fits this budget: checkpointing nothing is no recommendation
    baseline_time = profile.step_time_s
    predicted_time = None if baseline_time is None else baseline_time + plan.overhead_s
    coverage = profile.module_activation_total / max(1, profile.activation_at_peak)
    confidence = "high" if plan.method == "dp" and plan.exact and coverage >= 0.5 else "medium"
    if profile.oom or not profile.modules:
        confidence = "low"
    group = plan.modules[0].rpartition(".")[0] if plan.method == "dp" and plan.modules else "modules"
    ev = [
        f"measured peak {_gib(measured_peak(profile))} against a budget of {_gib(budget)} (target {_gib(target)})",
        f"checkpointing {len(plan.modules)} of {units.n} {'blocks' if plan.method == 'dp' else 'modules'} "
        f"keeps their inputs instead of {_gib(sum(units.blocks[i].activation_bytes for i in plan.indices))} of activations",
        f"recompute adds {plan.overhead_s * 1e3:.1f} ms per step (one more forward of each checkpointed module)",
        f"model activations attributed to modules cover {min(coverage, 1.0):.0%} of those at the peak",
    ]
    if plan.peak_bytes > target:
        ev.append(f"fits the budget but not the {MEMORY_PRESSURE:.0%} headroom target")
    curve = tradeoff_curve(units) if plan.method == "dp" else None
    return [
        Recommendation(
            id=f"checkpoint-{group.rpartition('.')[2] or 'blocks'}-{len(plan.modules)}",
            remedy="activation_checkpointing",
            title=f"Checkpoint {len(plan.modules)} {group} module(s): peak {_gib(plan.peak_bytes)}, +{plan.overhead_s * 1e3:.1f} ms/step",
            params={"modules": list(plan.modules)},
            predicted=Prediction(peak_memory_bytes=plan.peak_bytes, step_time_s=predicted_time),
            baseline=Prediction(peak_memory_bytes=measured_peak(profile), step_time_s=baseline_time),
            cost_model=f"{plan.method}: {COST_MODEL}",
            confidence=confidence,
            exact=True,  # non-reentrant checkpoint restores the RNG state: same numerics
            live=True,
            prerequisites=[
                "the modules' forward is re-run in backward: it must not change state outside its outputs",
            ],
            evidence=ev,
            curve=curve,
            fits=True,
        )
    ]


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
        evidence=[why] + ([f"lowest peak with activation checkpointing: {_gib(best_peak)}"] if best_peak else [])
        + ([f"budget {_gib(budget)}"] if budget else []),
        fits=False,
    )


def input_rule(profile: Profile) -> Finding | None:
    """Data loading above 5% of the step (no remedy built yet: the diagnosis says so)."""
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


RULES: list[Rule] = [memory_rule, input_rule]
