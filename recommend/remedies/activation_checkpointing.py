"""Activation checkpointing, the predictor half: spec, the plan it proposes for a memory finding.

The solver and its cost model are in ``checkpoint_solver`` (exact chain DP, greedy tree fallback)
over the memory model of ``recommend/memory_model.py``. The applier is
``apply/remedies/activation_checkpointing.py``. Non-reentrant checkpointing restores the RNG
state and recomputes bit-identical activations on deterministic kernels: ``live-exact``.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal, gib, largest_category
from advisor.recommend.memory_model import (
    COST_MODEL,
    Chain,
    added_step_time,
    chain_from_profile,
    chain_timeline,
    measured_peak,
)
from advisor.recommend.peak_model import MODEL as PEAK_MODEL
from advisor.recommend.peak_model import (
    ChainMemory,
    simulated_peak,
    solve,
)
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.remedies.checkpoint_solver import (
    Plan,
    greedy_tree,
    solve_chain,
    tradeoff_curve,
)
from advisor.records.advice import BlockChoice, CurvePoint, Evidence, Prediction, Recommendation
from advisor.records.units import fmt_seconds

HEADROOM = 0.90  # plan for this share of the budget first; a plan that only fits the budget still fits


def validate(params: Mapping[str, Any]) -> None:
    """``modules``: a non-empty list of distinct qualified module names (checked against the model
    in the training process, where the module tree is known)."""
    modules = params.get("modules")
    if isinstance(modules, str) or not isinstance(modules, (list, tuple)):
        raise ValueError(f"modules must be a list of module names, not {modules!r}")
    if not modules:
        raise ValueError("modules is empty: name at least one submodule to checkpoint")
    if not all(isinstance(m, str) and m for m in modules):
        raise ValueError(f"modules must be non-empty strings, got {list(modules)!r}")
    if len(set(modules)) != len(modules):
        raise ValueError(f"modules names one module twice: {list(modules)!r}")


def _simulated_plan(chain: Chain, memory: ChainMemory, budget: int) -> Plan | None:
    choice = solve(memory, [b.recompute_s for b in chain.blocks], budget)
    if choice is None:
        return None
    return Plan(modules=tuple(chain.blocks[i].name for i in choice.selected), indices=choice.selected,
                peak_bytes=choice.peak_bytes, overhead_s=choice.recompute_s, budget_bytes=budget,
                baseline_peak_bytes=memory.measured_peak_bytes, feasible=True, method="dp", exact=True,
                extra={"peak_model": PEAK_MODEL})


def simulated_curve(chain: Chain, memory: ChainMemory, points: int = 12) -> list[CurvePoint]:
    """``tradeoff_curve`` under the simulated peak: the least recompute at budgets from the lowest
    achievable peak (every block checkpointed) to the measured one."""
    low = simulated_peak(memory, range(chain.n))
    high = memory.measured_peak_bytes
    out = []
    for k in range(points):
        bound = int(round(low + (high - low) * k / (points - 1)))
        plan = _simulated_plan(chain, memory, bound)
        if plan is not None:
            out.append(CurvePoint(budget_bytes=bound, overhead_s=plan.overhead_s, peak_memory_bytes=plan.peak_bytes,
                                  modules_count=len(plan.indices)))
    return out


def fitting_plan(profile: Profile, budget: int) -> tuple[Chain | None, Plan | None]:
    """The least-recompute plan under ``HEADROOM`` of the budget, else under the budget itself.

    A plan fits when its predicted peak is within ``budget``: its ``feasible`` flag only says
    whether it met the bound it was solved against, which may be the headroom target. Where the
    deep step's timeline covers the chain, peaks come from the simulated backward
    (``recommend/peak_model.py``, exact against the tracker); otherwise from the conservative
    bound of ``memory_model``.
    """
    chain = chain_from_profile(profile)
    target = int(HEADROOM * budget)
    plan: Plan | None = None
    units: Chain | None = chain
    memory = chain_timeline(profile, chain)
    if chain is not None and memory is not None:
        plan = _simulated_plan(chain, memory, target) or _simulated_plan(chain, memory, budget)
        if plan is None:  # nothing fits: say how low checkpointing everything would go
            every = tuple(range(chain.n))
            plan = Plan(modules=chain.names, indices=every, peak_bytes=simulated_peak(memory, every),
                        overhead_s=sum(b.recompute_s for b in chain.blocks), budget_bytes=budget,
                        baseline_peak_bytes=memory.measured_peak_bytes, feasible=False, method="dp")
        if plan.peak_bytes <= budget:
            return units, plan
    elif chain is not None:
        plan = solve_chain(chain, target)
        if not plan.feasible:
            plan = solve_chain(chain, budget)
    if plan is None or plan.peak_bytes > budget:
        for bound in (target, budget):  # greedy adds modules until the bound holds, or none is left
            tree = greedy_tree(profile, bound)
            if tree is not None and tree[1].peak_bytes <= budget:
                units, plan = tree
                break
    return units, plan


def propose(profile: Profile, finding: Finding) -> Proposal:
    """One recommendation when a plan fits the finding's budget; none when nothing fits (the lowest
    peak it reaches goes back instead) or when activations are not the largest category at the peak
    (checkpointing cannot help)."""
    budget = finding.budget_bytes
    if not budget:
        return Proposal()
    if largest_category(profile) not in (None, "activation"):
        return Proposal(evidence=(Evidence(what="activation checkpointing",
                                           value="not proposed: activations are not the largest category"),))
    units, plan = fitting_plan(profile, budget)
    if plan is None or units is None or plan.peak_bytes > budget:
        best = plan.peak_bytes if plan is not None else None
        return Proposal(lowest_peak_bytes=best, evidence=(Evidence(
            what="lowest peak with activation checkpointing", value=best, unit="bytes", threshold=budget),))
    if not plan.modules:
        return Proposal()  # the job already fits this budget: checkpointing nothing is no recommendation
    target = int(HEADROOM * budget)
    baseline_time = profile.step_time_s
    predicted_time = None if baseline_time is None else baseline_time + added_step_time(profile, plan.overhead_s)
    coverage = profile.module_activation_total / max(1, profile.activation_at_peak)
    confidence = "high" if plan.method == "dp" and plan.exact and coverage >= 0.5 else "medium"
    if profile.oom or not profile.modules:
        confidence = "low"
    group = plan.modules[0].rpartition(".")[0] if plan.method == "dp" and plan.modules else "modules"
    ev = [
        f"measured peak {gib(measured_peak(profile))} against a budget of {gib(budget)} (target {gib(target)})",
        f"checkpointing {len(plan.modules)} of {units.n} {'blocks' if plan.method == 'dp' else 'modules'} "
        f"keeps their inputs instead of {gib(sum(units.blocks[i].activation_bytes for i in plan.indices))} of activations",
        f"recompute adds {fmt_seconds(plan.overhead_s)} per step (one more forward of each checkpointed module)"
        + (f", {fmt_seconds(predicted_time - baseline_time)} of it beyond the data wait the loader's workers leave"
           if predicted_time is not None and baseline_time is not None
           and predicted_time - baseline_time < plan.overhead_s - 1e-9 else ""),
        f"model activations attributed to modules cover {min(coverage, 1.0):.0%} of those at the peak",
    ]
    if plan.peak_bytes > target:
        ev.append(f"fits the budget but not the {HEADROOM:.0%} headroom target")
    memory = chain_timeline(profile, units) if plan.method == "dp" else None
    curve = (simulated_curve(units, memory) if memory is not None else tradeoff_curve(units)) if plan.method == "dp" else None
    return Proposal(recommendations=(
        Recommendation(
            id=f"checkpoint-{group.rpartition('.')[2] or 'blocks'}-{len(plan.modules)}",
            remedy=SPEC.name,
            title=f"Checkpoint {len(plan.modules)} {group} module(s)",  # peak and step time are columns
            params={"modules": list(plan.modules)},
            predicted=Prediction(peak_memory_bytes=plan.peak_bytes, step_time_s=predicted_time),
            baseline=Prediction(peak_memory_bytes=measured_peak(profile), step_time_s=baseline_time),
            budget_bytes=budget,
            cost_model=f"{plan.method}: " + (PEAK_MODEL if plan.extra.get("peak_model") else COST_MODEL),
            confidence=confidence,
            exact=True,  # non-reentrant checkpoint restores the RNG state: same numerics
            live=True,
            apply_class=SPEC.apply_class,
            prerequisites=[
                "the modules' forward is re-run in backward: it must not change state outside its outputs",
            ],
            evidence=ev,
            curve=curve,
            block_plan=([BlockChoice(name=b.name, choice="recompute" if b.name in plan.modules else "keep")
                         for b in units.blocks] if plan.method == "dp" else []),
        ),
    ))


SPEC = RemedySpec(
    name="activation_checkpointing",
    apply_class="live-exact",
    params=("modules",),
    validate=validate,
    phase="saved-tensors",
    addresses=("memory",),
    propose=propose,
)
