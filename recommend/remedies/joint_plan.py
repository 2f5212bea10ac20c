"""Joint plans, the predictor half: a ZeRO stage with activation checkpointing, and where the device
has its own memory activation and optimizer-state offload, solved together when no single remedy
fits the budget.

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

Offload joins the search where the device has its own memory (not a CPU-only job, whose memory is
host memory already) and the training process's checks allow it: each block then chooses keep,
recompute or offload, and the sharded optimizer state may live on the host between steps, solved
by ``offload.solve`` on the stage's rewritten timeline with the stage's model states (``stage_model``:
the state moved is this rank's shard, S_k; during ``step()`` the device holds P_k + G_k + S_k). Its
time terms are ``offload.py``'s (copies hidden behind the next block's compute; 2 S_k over the host
link for the state). Exact as ``offload.solve`` is (its tests compare with brute force; here
tests/test_joint_plan.py compares the stage search with ``offload.brute_force``). Where the state can
be offloaded a plan without sharding is searched too (stage 0, also on a single device: the
measured timeline as it is, and the blocks changed with the state offloaded, since either alone is
a single remedy).

Applied as one unit by ``apply/remedies/joint_plan.py`` in ``advisor.records.remedy.PHASES`` order
(what blocks save first, then the stage, then where the state lives), kept or reverted whole. Its
apply class is the strictest of its parts'. Not planned: pipeline splits (restart-class: they
change the job's ranks, which a live plan cannot).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from advisor.recommend.finding import Finding, Proposal, gib
from advisor.recommend.memory_model import chain_from_profile, measured_peak
from advisor.recommend.peak_model import MODEL as PEAK_MODEL
from advisor.recommend.memory_model import Chain
from advisor.recommend.peak_model import (KEEP, OFFLOAD, RECOMPUTE, ChainMemory, Sample, chain_memory,
                                          module_figures, simulated_peak, solve)
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec, check_params
from advisor.recommend.remedies import offload
from advisor.recommend.remedies import optimizer_offload
from advisor.recommend.remedies import zero as zero_remedy
from advisor.recommend.remedies.activation_checkpointing import HEADROOM
from advisor.recommend.remedies.zero_model import Measured, stage_cost
from advisor.records.advice import APPLY_CLASSES, Evidence, PlanPart, Prediction, Recommendation
from advisor.records.units import fmt_rate, fmt_seconds

NAME = "joint_plan"
STATES = ("parameter", "gradient", "optimizer_state")
COST_MODEL = ("ZeRO-k's per-category scaling (zero_model) applied at every instant of the measured timeline, "
              f"then the checkpointing program over the chain on it ({PEAK_MODEL}); "
              "step = ZeRO-k's step + the checkpointed blocks' recompute")
OFFLOAD_COST_MODEL = ("ZeRO-k's per-category scaling (zero_model) applied at every instant of the measured timeline, "
                      f"then the keep/recompute/offload program over the chain on it ({PEAK_MODEL}), the sharded "
                      "optimizer state on the host between steps lowering every instant but step() by its bytes; "
                      "step = ZeRO-k's step + recompute + the copies the next block's compute cannot hide "
                      "(recommend/remedies/offload.py) + 2 x the state shard over the host link")
NOT_REPLAYED = ("not planned: no deep step ran the chain's forward and backward once (gradient accumulation, "
                "several forwards per step), so the timeline the plans are solved on cannot be replayed")
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
    """One stage's cheapest fitting plan: the blocks checkpointed (``selected``) and offloaded, and
    whether the optimizer state lives on the host."""

    stage: int
    selected: tuple[int, ...]
    peak_bytes: int
    recompute_s: float  # every second the plan adds to the stage's step: recompute and exposed copies
    step_time_s: float | None  # the stage's step plus ``recompute_s``; None when the stage's is unknown
    offloaded: tuple[int, ...] = ()
    offload_optimizer: bool = False

    def choices(self, n: int) -> tuple[str, ...]:
        """Each of the ``n`` blocks' choice (``peak_model``'s names)."""
        return tuple(RECOMPUTE if i in self.selected else OFFLOAD if i in self.offloaded else KEEP for i in range(n))


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


def stage_model(m: Measured, stage: int, bandwidth: float) -> offload.Model:
    """``offload.py``'s model at ``stage``: this rank's optimizer-state shard is what offloading
    moves; during ``step()`` the device holds the stage's parameters, gradients and that shard."""
    cost = stage_cost(m, stage)
    return offload.Model(bandwidth=bandwidth, optimizer_state_bytes=cost.optimizer_state_bytes,
                         step_peak_bytes=cost.parameter_bytes + cost.gradient_bytes + cost.optimizer_state_bytes)


def offload_pick(stage: int, chain: Chain, memory: ChainMemory, model: offload.Model, stage_step_s: float | None,
                 budget: int, *, blocks: Sequence[str], optimizer: bool) -> Pick | None:
    """The least-time plan at ``stage`` over the per-block ``blocks`` choices and (``optimizer``)
    the state's offload, fitting ``HEADROOM`` of ``budget`` first, as every memory plan is; a
    stage that fits with nothing changed takes ``stage_pick``'s cheapest single checkpoint (a plan
    has two parts); None when nothing fits. Stage 0 (no sharding): a plan is blocks changed with
    the state offloaded, both (either alone is a single remedy), so the state's offload is forced
    and a plan that changes no block is none."""
    recompute = [float(b.recompute_s or 0.0) for b in chain.blocks]
    state = True if stage == 0 else None if optimizer else False
    for bound in (int(HEADROOM * budget), budget):
        plan = offload.solve(chain, model, bound, allowed=tuple(blocks), optimizer=state, memory=memory)
        if not plan.feasible:
            continue
        if all(c == KEEP for c in plan.choices) and (stage == 0 or not plan.offload_optimizer):
            break
        return Pick(stage=stage, selected=tuple(i for i, c in enumerate(plan.choices) if c == RECOMPUTE),
                    offloaded=tuple(i for i, c in enumerate(plan.choices) if c == OFFLOAD),
                    offload_optimizer=plan.offload_optimizer, peak_bytes=plan.peak_bytes, recompute_s=plan.overhead_s,
                    step_time_s=None if stage_step_s is None else stage_step_s + plan.overhead_s)
    return None if stage == 0 else stage_pick(stage, memory, recompute, stage_step_s, budget)


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


def offload_options(profile: Profile, names: Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """The per-block choices a plan may make and whether it may offload the optimizer state: offload
    only where the device has its own memory and the remedy's check in the training process allows
    it (on a CPU-only job the memory is host memory already)."""
    if profile.device_type == "cpu":
        return (KEEP, RECOMPUTE), False
    blocks = (KEEP, RECOMPUTE, OFFLOAD) if profile.refusal("activation_offload", {"modules": list(names)}) is None \
        else (KEEP, RECOMPUTE)
    return blocks, profile.refusal("optimizer_offload", {"optimizers": None}) is None


def propose(profile: Profile, finding: Finding) -> Proposal:
    """For a memory finding no single remedy fits: one plan per ZeRO stage that fits with the
    block and state remedies this job can take, and, where the state can be offloaded, one without
    sharding (stage 0: the blocks and the state's offload together); when none fits, the lowest
    peak a plan reaches."""
    budget = finding.budget_bytes
    chain = chain_from_profile(profile)
    if (not budget or chain is None or not chain.contiguous or not profile.memory_timeline
            or int(profile.categories_at_peak.get("optimizer_state", 0)) <= 0):
        return Proposal()
    blocks, optimizer = offload_options(profile, chain.names)
    stages = ([0] if optimizer else []) + _stages(profile)
    if not stages:
        return Proposal()
    m = zero_remedy.measured(profile) if stages[-1] > 0 else None
    figures = module_figures(profile.modules)
    recompute = [float(b.recompute_s or 0.0) for b in chain.blocks]
    base = chain_memory(profile.memory_timeline, chain.names, *figures)
    if base is None:  # the plans move the peak's instant: without a replayable step they are not guessed
        return Proposal(evidence=(Evidence(what="joint plans", value=NOT_REPLAYED),))
    offloading = optimizer or OFFLOAD in blocks
    bandwidth = offload.bandwidth_of(profile)[0]
    picks, lowest = [], None
    for stage in stages:
        if stage == 0:
            memory, step, model = base, profile.step_time_s, offload.model_for(profile)
        else:
            assert m is not None
            memory = chain_memory(scaled_timeline(profile.memory_timeline, factors(m, stage)), chain.names, *figures)
            step, model = stage_cost(m, stage).step_time_s, stage_model(m, stage, bandwidth)
        if memory is None:
            continue
        if offloading:
            low = offload.solve(chain, model, 0, allowed=blocks, optimizer=None if optimizer else False,
                                memory=memory).peak_bytes
            pick = offload_pick(stage, chain, memory, model, step, budget, blocks=blocks, optimizer=optimizer)
        else:
            low = simulated_peak(memory, range(chain.n))
            pick = stage_pick(stage, memory, recompute, step, budget)
        lowest = low if lowest is None else min(lowest, low)
        if pick is not None:
            picks.append(pick)
    if not picks:
        what = "lowest peak with " + ("ZeRO, " if m is not None else "") + (
            "activation checkpointing and offload" if offloading else "activation checkpointing") + " together"
        return Proposal(lowest_peak_bytes=lowest, evidence=(Evidence(
            what=what, value=lowest, unit="bytes", threshold=budget),) if lowest is not None else ())
    recs = tuple(_recommendation(profile, m, chain, base, pick, budget)
                 for pick in sorted(picks, key=lambda p: p.stage))
    return Proposal(recommendations=tuple(r for r in recs if r is not None))


def _block_part(profile: Profile, chain: Chain, base: ChainMemory, pick: Pick) -> PlanPart | None:
    """The plan's block part alone on the job as it is: checkpointing, or activation offload carrying
    the recomputed blocks (``checkpoint``); None when it changes no block or the job refuses it."""
    names = list(chain.names)
    rec = [names[i] for i in pick.selected]
    off = [names[i] for i in pick.offloaded]
    if not rec and not off:
        return None
    baseline_time = profile.step_time_s
    if off:
        params: dict[str, Any] = {"modules": off, **({"checkpoint": rec} if rec else {})}
        peak, added = offload.evaluate(chain, offload.model_for(profile), pick.choices(chain.n), False, base)
        remedy, part_id = "activation_offload", f"offload-{len(off)}" + (f"-checkpoint-{len(rec)}" if rec else "")
    else:
        params = {"modules": rec}
        peak, added = simulated_peak(base, pick.selected), sum(float(chain.blocks[i].recompute_s or 0.0) for i in pick.selected)
        group = rec[0].rpartition(".")[0] or "blocks"
        remedy, part_id = "activation_checkpointing", f"checkpoint-{group.rpartition('.')[2] or 'blocks'}-{len(rec)}"
    if profile.refusal(remedy, params) is not None:
        return None
    return PlanPart(id=part_id, remedy=remedy, params=params, apply_class="live-exact",
                    predicted=Prediction(peak_memory_bytes=peak,
                                         step_time_s=None if baseline_time is None else baseline_time + added))


def _optimizer_part(profile: Profile) -> PlanPart:
    """Optimizer-state offload alone on the job as it is (``optimizer_offload.py``'s prediction)."""
    step = profile.step_time_s
    cost = offload.optimizer_cost(offload.model_for(profile))
    return PlanPart(id="optimizer-offload", remedy="optimizer_offload", params={"optimizers": None},
                    predicted=Prediction(peak_memory_bytes=optimizer_offload.predicted_peak(profile),
                                         step_time_s=None if step is None else step + cost),
                    apply_class=optimizer_offload.SPEC.apply_class)


def _recommendation(profile: Profile, m: Measured | None, chain: Chain, base: ChainMemory, pick: Pick,
                    budget: int) -> Recommendation | None:
    stage, n = pick.stage, profile.world_size
    names = list(chain.names)
    block = _block_part(profile, chain, base, pick)
    if block is None and (pick.selected or pick.offloaded):
        return None  # the job refused the block part
    zero_alone = stage_cost(m, stage) if stage and m is not None else None
    zero = None if zero_alone is None else PlanPart(
        id=f"zero-{stage}", remedy="zero", params={"stage": stage},
        predicted=Prediction(peak_memory_bytes=zero_alone.peak_bytes, step_time_s=zero_alone.step_time_s),
        apply_class=zero_remedy.APPLY_CLASSES[stage])
    parts = tuple(p for p in (block, zero, _optimizer_part(profile) if pick.offload_optimizer else None) if p is not None)
    apply_class = strictest([p.apply_class for p in parts])
    host_synchronous = stage > 1 and profile.device_type == "cpu"
    copies = pick.offload_optimizer or bool(pick.offloaded)
    bandwidth, source = offload.bandwidth_of(profile)
    group = names[(pick.selected or pick.offloaded)[0]].rpartition(".")[0] if block is not None else ""
    group = group or "blocks"
    alone = [f"{p.id} alone: peak {gib(p.predicted.peak_memory_bytes or 0)}"
             + ("" if (p.predicted.peak_memory_bytes or 0) <= budget else " (over the budget)")
             + (f", step {fmt_seconds(p.predicted.step_time_s)}" if p.predicted.step_time_s is not None else "")
             for p in parts]
    doing = [f"ZeRO-{stage} cuts the model states on every one of the {n} ranks"] if zero else []
    if pick.selected:
        doing.append(f"checkpointing {len(pick.selected)} of the {len(names)} blocks of {group} cuts the activations "
                     + ("where the sharded job peaks" if zero else "kept for backward"))
    if pick.offloaded:
        doing.append(f"offloading {len(pick.offloaded)} of the {len(names)} blocks of {group} keeps their activations "
                     "on the host until their backward")
    holder = "this rank's optimizer-state shard" if zero else "the optimizer state"
    if pick.offload_optimizer:
        state = (stage_model(m, stage, bandwidth) if zero and m is not None else offload.model_for(profile)).optimizer_state_bytes
        doing.append(f"{holder} ({gib(state)}) lives on the host between steps")
    ev = [f"measured peak {gib(measured_peak(profile))} against a budget of {gib(budget)}: no single remedy fits",
          *alone,
          "together: " + "; ".join(doing) + f"; the plan adds {fmt_seconds(pick.recompute_s)} per step",
          "applied as one unit at one step boundary on every rank (what blocks save, "
          + ("then the stage, " if zero else "") + "then where the state lives), kept or reverted whole"]
    if copies:
        ev.append(f"host link {fmt_rate(bandwidth)} ({source})")
    if zero_alone is not None and zero_alone.step_time_s is None:
        ev.append("step time not predicted: no all-reduce of this job was measured (comm probe off?)")
    if host_synchronous:
        ev.append(zero_remedy.HOST_SYNCHRONOUS)
    prereq = ["one optimizer holding exactly the DDP model's trainable parameters", zero_remedy.CHECKPOINT_CAVEAT] \
        if zero else []
    if pick.selected:
        prereq.insert(0, "the modules' forward is re-run in backward: it must not change state outside its outputs")
    if pick.offloaded:
        prereq.append("host memory for the offloaded activations (pinned on CUDA)")
    if pick.offload_optimizer:
        prereq.append(f"host memory for {holder} (pinned on CUDA)")
    unknown = zero_alone is not None and zero_alone.step_time_s is None
    low = host_synchronous or unknown or profile.oom or (copies and source != "measured")
    words = [f"ZeRO-{stage}"] if zero else []
    if pick.offloaded:
        words.append(f"offloading {len(pick.offloaded)} {group} module(s)")
    if pick.selected:
        words.append(f"checkpointing {len(pick.selected)} {group} module(s)")
    if pick.offload_optimizer:
        words.append("the optimizer state on the host")
    plan_id = "+".join(([f"zero-{stage}"] if zero else []) + ([f"offload-{len(pick.offloaded)}"] if pick.offloaded else [])
                       + ([f"ckpt-{len(pick.selected)}"] if pick.selected else [])
                       + (["optim-offload"] if pick.offload_optimizer else []))
    return Recommendation(
        id=plan_id,
        remedy=NAME,
        title=(", ".join(words[:-1]) + " and " + words[-1]) + ", together",
        params={"parts": [{"remedy": p.remedy, "params": dict(p.params)} for p in parts]},
        predicted=Prediction(peak_memory_bytes=pick.peak_bytes, step_time_s=pick.step_time_s),
        baseline=Prediction(peak_memory_bytes=measured_peak(profile), step_time_s=profile.step_time_s),
        budget_bytes=budget,
        cost_model=OFFLOAD_COST_MODEL if copies else COST_MODEL,
        confidence="low" if low else "medium",
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
