"""Joint plans, the predictor half: a ZeRO stage and activation checkpointing solved together when
no single remedy fits the budget.

Each remedy alone is ranked by its own model: ZeRO scales the model-state categories measured at
the peak (``zero_model.py``), checkpointing simulates the backward over the measured timeline
(``peak_model.py``). A plan of both needs one model of both, because sharding moves the instant
of the peak: with the model states cut, the peak may fall in another block's backward, where
another selection of checkpointed blocks pays off. So the planner rewrites the measured timeline
for each stage k and solves the checkpointing program on it:

    total_k(t) = total(t) - P(t) - G(t) - S(t) + P(t) f_P(k) + G(t) f_G(k) + S(t) f_S(k)

where P, G, S are the parameter, gradient and optimizer-state bytes of each sample and f_c(k) is
ZeRO-k's figure for category c over the measured one at the peak (``stage_cost``: 1/N for the
sharded states, plus what FSDP2 gathers of the parameters). At the peak's instant this is
ZeRO-k's own prediction; elsewhere it is the same formula at that instant's bytes. Then

    plan = argmin over stages k in {1, 2, 3} and block sets S of  step_k + sum_{i in S} recompute_i
           subject to peak(total_k, S) <= budget

exact: within a stage, ``peak_model.solve`` is an exact dynamic program over the chain; across
stages the least time of the (at most three) stage optima is taken. ``best_plan`` is that search,
tested against brute force (tests/test_joint_plan.py). A plan is offered only as a live fallback (no
single remedy that applies live fits), with at most one plan per stage, each of at least one
checkpointed block (none: ZeRO alone, offered as itself).

Applied as one unit by ``apply/remedies/joint_plan.py`` (checkpointing first, then the stage, in
``advisor.records.remedy.PHASES`` order), kept or reverted whole. Its apply class is the strictest
of its parts'. Not planned yet: activation and optimizer-state offload, pipeline splits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from advisor.recommend.finding import Finding, Proposal, gib
from advisor.recommend.memory_model import chain_from_profile, measured_peak
from advisor.recommend.peak_model import MODEL as PEAK_MODEL
from advisor.recommend.peak_model import ChainMemory, Sample, chain_memory, module_figures, simulated_peak, solve
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec, check_params
from advisor.recommend.remedies import zero as zero_remedy
from advisor.recommend.remedies.activation_checkpointing import HEADROOM
from advisor.recommend.remedies.zero_model import Measured, stage_cost
from advisor.records.advice import APPLY_CLASSES, Evidence, PlanPart, Prediction, Recommendation
from advisor.records.units import fmt_seconds

NAME = "joint_plan"
STATES = ("parameter", "gradient", "optimizer_state")
COST_MODEL = ("ZeRO-k's per-category scaling (zero_model) applied at every instant of the measured timeline, "
              f"then the checkpointing program over the chain on it ({PEAK_MODEL}); "
              "step = ZeRO-k's step + the checkpointed blocks' recompute")
# ``APPLY_CLASSES`` runs from the least strict to the strictest: a plan takes its strictest part's.
STRICTNESS = APPLY_CLASSES


def strictest(classes: Sequence[str]) -> str:
    """The strictest of ``classes`` (``STRICTNESS`` order)."""
    return max(classes, key=STRICTNESS.index)


# --- the parameters the applier takes ---------------------------------------------------------

def validate(params: Mapping[str, Any]) -> None:
    """``parts``: two or more ``{"remedy", "params"}`` of distinct known remedies (not a joint plan),
    each checked by its own spec."""
    parts = params.get("parts")
    if isinstance(parts, (str, bytes)) or not isinstance(parts, (list, tuple)) or len(parts) < 2:
        raise ValueError(f"parts must be a list of two or more {{remedy, params}} objects, not {parts!r}")
    seen = set()
    for part in parts:
        if not isinstance(part, Mapping) or set(part) != {"remedy", "params"}:
            raise ValueError(f"each part must be an object with exactly the keys remedy and params, not {part!r}")
        name = part["remedy"]
        if name == NAME:
            raise ValueError("a joint plan cannot hold another joint plan")
        if name in seen:
            raise ValueError(f"remedy {name!r} is named twice in one plan")
        seen.add(name)
        check_params(name, part["params"])


# --- the model ----------------------------------------------------------------------------------

def factors(m: Measured, stage: int) -> dict[str, float]:
    """ZeRO-``stage``'s bytes of each model-state category over the measured ones at the peak."""
    cost = stage_cost(m, stage)
    new = {"parameter": cost.parameter_bytes, "gradient": cost.gradient_bytes,
           "optimizer_state": cost.optimizer_state_bytes}
    old = {"parameter": m.parameter_bytes, "gradient": m.gradient_bytes, "optimizer_state": m.optimizer_state_bytes}
    return {c: (new[c] / old[c] if old[c] else 1.0) for c in STATES}


def scaled_timeline(samples: Sequence[Sample], scale: Mapping[str, float]) -> list[Sample]:
    """Every sample with its model-state categories scaled by ``scale`` (its total by the same bytes)."""
    out = []
    for s in samples:
        cats = dict(s.categories)
        delta = 0
        for c, f in scale.items():
            if cats.get(c):
                new = int(round(cats[c] * f))
                delta += new - cats[c]
                cats[c] = new
        out.append(replace(s, categories=cats, total_bytes=s.total_bytes + delta))  # type: ignore[type-var]
    return out


@dataclass(frozen=True, kw_only=True)
class Pick:
    """One stage's cheapest fitting selection of checkpointed blocks."""

    stage: int
    selected: tuple[int, ...]
    peak_bytes: int
    recompute_s: float
    step_time_s: float | None  # the stage's step plus the recompute; None when the stage's is unknown


def stage_pick(stage: int, memory: ChainMemory, recompute_s: Sequence[float], stage_step_s: float | None,
               budget: int) -> Pick | None:
    """The least-recompute selection (at least one block) whose peak at ``stage`` fits ``budget``,
    solved against ``HEADROOM`` of it first, as checkpointing alone is; None when none fits."""
    for bound in (int(HEADROOM * budget), budget):
        choice = solve(memory, recompute_s, bound)
        selected = None if choice is None else choice.selected or _cheapest_single(memory, recompute_s, bound)
        if not selected:
            continue
        peak = simulated_peak(memory, selected)
        cost = sum(recompute_s[i] for i in selected)
        return Pick(stage=stage, selected=selected, peak_bytes=peak, recompute_s=cost,
                    step_time_s=None if stage_step_s is None else stage_step_s + cost)
    return None


def _cheapest_single(memory: ChainMemory, recompute_s: Sequence[float], bound: int) -> tuple[int, ...]:
    """The stage fits with nothing checkpointed: still a plan of two parts, with the one block
    whose checkpoint costs least among those that keep the peak within ``bound``; () if none does."""
    fitting = [i for i in range(len(memory.blocks)) if simulated_peak(memory, (i,)) <= bound]
    return (min(fitting, key=lambda i: (recompute_s[i], -memory.blocks[i].saving_bytes)),) if fitting else ()


def best_plan(picks: Sequence[Pick]) -> Pick | None:
    """The pick of least predicted step time (unknown times last, then the lowest peak)."""
    if not picks:
        return None
    return min(picks, key=lambda p: (p.step_time_s is None, p.step_time_s or 0.0, p.peak_bytes, p.stage))


# --- the proposal -------------------------------------------------------------------------------

def _stages(profile: Profile) -> list[int]:
    """The ZeRO stages this job can take (its refusals are the ZeRO remedy's)."""
    if profile.world_size < 2 or zero_remedy.refusal(profile) is not None:
        return []
    return [k for k in zero_remedy.STAGES
            if zero_remedy.checkpoint_refusal(profile.checkpoint_saves, k) is None
            and profile.refusal("zero", {"stage": k}) is None]


def propose(profile: Profile, finding: Finding) -> Proposal:
    """For a memory finding no single remedy fits: one plan per ZeRO stage that fits together with
    activation checkpointing; when none fits, the lowest peak a plan reaches."""
    budget = finding.budget_bytes
    stages = _stages(profile)
    chain = chain_from_profile(profile)
    if (not budget or not stages or chain is None or not chain.contiguous or not profile.memory_timeline
            or int(profile.categories_at_peak.get("optimizer_state", 0)) <= 0):
        return Proposal()
    m = zero_remedy.measured(profile)
    figures = module_figures(profile.modules)
    recompute = [float(b.recompute_s or 0.0) for b in chain.blocks]
    base = chain_memory(profile.memory_timeline, chain.names, *figures)
    if base is None:
        return Proposal()
    picks, lowest = [], None
    for stage in stages:
        memory = chain_memory(scaled_timeline(profile.memory_timeline, factors(m, stage)), chain.names, *figures)
        if memory is None:
            continue
        low = simulated_peak(memory, range(chain.n))
        lowest = low if lowest is None else min(lowest, low)
        pick = stage_pick(stage, memory, recompute, stage_cost(m, stage).step_time_s, budget)
        if pick is not None:
            picks.append(pick)
    if not picks:
        return Proposal(lowest_peak_bytes=lowest, evidence=(Evidence(
            what="lowest peak with ZeRO and activation checkpointing together", value=lowest, unit="bytes",
            threshold=budget),) if lowest is not None else ())
    names = list(chain.names)
    recs = tuple(_recommendation(profile, m, base, names, recompute, pick, budget)
                 for pick in sorted(picks, key=lambda p: p.stage)
                 if profile.refusal("activation_checkpointing", {"modules": [names[i] for i in pick.selected]}) is None)
    return Proposal(recommendations=recs)


def _recommendation(profile: Profile, m: Measured, base: ChainMemory, names: list[str], recompute: list[float],
                    pick: Pick, budget: int) -> Recommendation:
    stage, n = pick.stage, profile.world_size
    modules = [names[i] for i in pick.selected]
    group = modules[0].rpartition(".")[0] or "blocks"
    baseline_time = profile.step_time_s
    zero_alone = stage_cost(m, stage)
    ckpt_peak = simulated_peak(base, pick.selected)
    ckpt_time = None if baseline_time is None else baseline_time + pick.recompute_s
    ckpt_id = f"checkpoint-{group.rpartition('.')[2] or 'blocks'}-{len(modules)}"
    parts = (
        PlanPart(id=ckpt_id, remedy="activation_checkpointing", params={"modules": modules},
                 predicted=Prediction(peak_memory_bytes=ckpt_peak, step_time_s=ckpt_time),
                 apply_class="live-exact"),
        PlanPart(id=f"zero-{stage}", remedy="zero", params={"stage": stage},
                 predicted=Prediction(peak_memory_bytes=zero_alone.peak_bytes, step_time_s=zero_alone.step_time_s),
                 apply_class=zero_remedy.APPLY_CLASSES[stage]),
    )
    apply_class = strictest([p.apply_class for p in parts])
    host_synchronous = stage > 1 and profile.device_type == "cpu"
    alone = [f"{p.id} alone: peak {gib(p.predicted.peak_memory_bytes or 0)}"
             + ("" if (p.predicted.peak_memory_bytes or 0) <= budget else " (over the budget)")
             + (f", step {fmt_seconds(p.predicted.step_time_s)}" if p.predicted.step_time_s is not None else "")
             for p in parts]
    ev = [f"measured peak {gib(measured_peak(profile))} against a budget of {gib(budget)}: no single remedy fits",
          *alone,
          f"together: ZeRO-{stage} cuts the model states on every one of the {n} ranks, and checkpointing "
          f"{len(modules)} of the {len(names)} blocks of {group} cuts the activations where the sharded job peaks; "
          f"recompute adds {fmt_seconds(pick.recompute_s)} per step",
          "applied as one unit at one step boundary on every rank (checkpointing, then the stage), kept or "
          "reverted whole"]
    if zero_alone.step_time_s is None:
        ev.append("step time not predicted: no all-reduce of this job was measured (comm probe off?)")
    if host_synchronous:
        ev.append(zero_remedy.HOST_SYNCHRONOUS)
    prereq = ["the modules' forward is re-run in backward: it must not change state outside its outputs",
              "one optimizer holding exactly the DDP model's trainable parameters",
              zero_remedy.CHECKPOINT_CAVEAT]
    confidence = "low" if host_synchronous or zero_alone.step_time_s is None or profile.oom else "medium"
    return Recommendation(
        id=f"zero-{stage}+ckpt-{len(modules)}",
        remedy=NAME,
        title=f"ZeRO-{stage} and checkpointing {len(modules)} {group} module(s), together",
        params={"parts": [{"remedy": p.remedy, "params": dict(p.params)} for p in parts]},
        predicted=Prediction(peak_memory_bytes=pick.peak_bytes, step_time_s=pick.step_time_s),
        baseline=Prediction(peak_memory_bytes=measured_peak(profile), step_time_s=baseline_time),
        budget_bytes=budget,
        cost_model=COST_MODEL,
        confidence=confidence,
        exact=apply_class == "live-exact",
        live=True,
        apply_class=apply_class,
        prerequisites=prereq,
        evidence=ev,
        parts=parts,
    )


SPEC = RemedySpec(
    name=NAME,
    apply_class="live-equivalent",  # each plan says its own: the strictest of its parts
    params=("parts",),
    validate=validate,
    phase="layout",
    addresses=("memory",),
    propose=propose,
    live_fallback=True,
)
