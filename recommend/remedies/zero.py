"""ZeRO stages 1-3 on a DDP job, the predictor half: spec, per-stage proposals.

The figures come from ``zero_model.py`` (its docstring has the formulas: per-rank parameter,
gradient and optimizer-state bytes of each stage from REFERENCE.md's table, calibrated by the
categories measured at the peak, plus FSDP's gathered units; collective time from the bytes
each stage moves at the job's measured bus bandwidth, with today's hidden share).

Every stage that lowers the peak is proposed with its own prediction; the advice ranking (fits
the budget first, then by step time) puts the cheapest stage that fits first, and the rest
after it. Refused, with the reason in the finding's evidence: no optimizer identified, more than
one optimizer, a model wrapped otherwise than by DDP, and the script's own checkpointing where
a stage would make it partial. The agent reports each kind of save of the model's or the
optimizer's state it sees (``checkpoint_save`` events, ``advisor/agent/saves.py``); which stage
makes which save partial is one rule, ``advisor/records/checkpoint_saves.py``, shared with the
agent's warning. A stage that keeps a seen save whole is proposed with a note saying so.

A save not seen yet (every 1000 steps, or only at the end) cannot be refused on: each
recommendation says in its prerequisites what ZeRO changes there, and the agent warns when the
script saves partial state while the remedy is in force.

Apply classes: stage 1 is ``live-exact`` (the same all-reduce, the same per-element updates);
stages 2 and 3 are ``live-equivalent``: FSDP2 reduce-scatters where DDP all-reduces (another
summation order beyond 2 ranks or on NCCL rings), and a gradient-norm clip sums DTensor shards
before the all-reduce. The applier is ``apply/remedies/zero.py``.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from advisor.recommend.finding import Finding, Proposal, gib
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.remedies.zero_lower import lower_stage
from advisor.recommend.remedies.zero_model import STAGE_TRAFFIC, Measured, StageCost, stage_cost
from advisor.recommend.rules._figures import comm_steps, median_per_step
from advisor.records.advice import Evidence, Prediction, Recommendation
from advisor.records.bandwidth import busbw
from advisor.records.checkpoint_saves import partial_state
from advisor.records.events import CheckpointSave
from advisor.records.units import fmt_rate, fmt_seconds

STAGES = (1, 2, 3)
COST_MODELS = {
    1: "peak - optimizer state x (1 - 1/N_d) + the largest parameter's state; step - optimizer step "
       "x (1 - 1/N_d) + parameter bytes / measured bus bandwidth (owners broadcast after each step)",
    2: "peak - (P + G + S) + P/N_d + P + (G + S)/N_d (FSDP2 keeps gathered parameters from forward to "
       "backward); step - exposed collectives + the same traffic (reduce-scatter + all-gather) exposed "
       "as today - optimizer step x (1 - 1/N_d)",
    3: "peak - (P + G + S) + (P + G + S)/N_d + two gathered units; step - exposed collectives + 1.5x "
       "DDP's traffic (all-gather in forward and backward) exposed as today - optimizer step x (1 - 1/N_d)",
}
COST_MODEL = COST_MODELS[1]
# What the stage 2/3 step time leaves out where the collectives run on the host (gloo on CPU), and
# what bench/zero.py measured of it (2 ranks of examples/ddp.py, 2026-11-26): ZeRO-2 61 ms for
# 24 ms predicted, ZeRO-3 79-80 ms for 28 ms; FSDP2 added 18 ms to a 3.5 ms forward over 5 units.
HOST_SYNCHRONOUS = ("step time is a lower bound here: on CPU (gloo) FSDP2 runs each unit's all-gather and "
                    "reduce-scatter synchronously on the host, a wait for the other ranks per unit, with its "
                    "copies in and out and its hooks, none of which the traffic model counts; the executor "
                    "measures the real step after the switch and reverts a stage that is too slow")
APPLY_CLASSES = {1: "live-exact", 2: "live-equivalent", 3: "live-equivalent"}
CHECKPOINT_CAVEAT = ("while it is in force each rank's optimizer.state_dict() (and, for stages 2 and 3, "
                     "model.state_dict()) holds only its own shard: a script that saves a checkpoint with "
                     "torch.save on one rank needs every rank's file, torch.distributed.checkpoint, or a "
                     "revert first")


def _where(save: CheckpointSave) -> str:
    return f"first seen at step {save.step} on rank {save.rank}" if save.step is not None else f"seen on rank {save.rank}"


def _api(save: CheckpointSave) -> str:
    return "torch.save" if save.api == "torch.save" else f"torch.distributed.checkpoint ({save.api})"


def checkpoint_refusal(saves: Sequence[CheckpointSave], stage: int) -> str | None:
    """Why the script's own checkpoint saves (``Profile.checkpoint_saves``) rule out ZeRO-``stage``,
    or None (the rule: ``advisor/records/checkpoint_saves.py``)."""
    for save in saves:
        state = partial_state(save.api, save.saves, stage)
        if state == "model":
            return (f"the script saves its model's state_dict() with torch.save ({_where(save)}): under ZeRO-2/3 "
                    "model.state_dict() holds each rank's DTensor shards, so that checkpoint would be partial")
        if state == "optimizer" and save.api == "torch.save":
            return (f"the script saves its optimizer's state_dict() with torch.save ({_where(save)}): under ZeRO "
                    "each rank's optimizer.state_dict() holds only its own share of the state, so that checkpoint "
                    "would be partial")
        if state == "optimizer":
            return (f"the script saves its optimizer's state with {_api(save)} ({_where(save)}): under ZeRO-1 "
                    "each rank's optimizer.state_dict() numbers only the parameters it owns, from 0 on every rank, "
                    "so the ranks' entries would collide in the checkpoint")
    return None


def checkpoint_note(saves: Sequence[CheckpointSave], stage: int) -> str | None:
    """What the recommendation of ZeRO-``stage`` says about the script's saves it allows."""
    seen = [s for s in saves if checkpoint_refusal([s], stage) is None]
    if not seen:
        return None
    parts = sorted({f"{'/'.join(s.saves)} with {_api(s)}" for s in seen})
    why = ("torch.distributed.checkpoint writes every rank's DTensor shard, so the checkpoint stays whole"
           if stage > 1 else "under ZeRO-1 the parameters stay whole on every rank")
    return f"the script saves its {'; '.join(parts)} ({_where(seen[0])}): {why}"


def parse_stage(value: Any) -> int:
    """The ZeRO stage as an int; ``ValueError`` naming the built stages."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in STAGES:
        raise ValueError(f"ZeRO stage {value!r} is not built; valid: {list(STAGES)}")
    return value


def validate(params: Mapping[str, Any]) -> None:
    parse_stage(params.get("stage"))


def measured_busbw(profile: Profile) -> float | None:
    """Median bus bandwidth (bytes/s) of this job's all-reduces, from ``CollectiveStat`` records."""
    values = [busbw(c.op, c.bytes, c.time_s, c.group_size) for c in profile.collectives
              if c.op == "all_reduce" and c.bytes > 0 and c.time_s > 0 and c.group_size > 1]
    values = [v for v in values if v]
    return statistics.median(values) if values else None


def largest_unit_bytes(profile: Profile, params: int) -> int:
    """Parameter bytes of the largest unit FSDP2 would gather at once: the applier's blocks are
    the entries of ModuleLists (module names ending in an index), the root takes the rest.
    Without module records: the whole model (the cautious bound)."""
    blocks = [m for m in profile.modules if m.name.rpartition(".")[2].isdigit()]
    top = [m for m in blocks if not any(m.name.startswith(b.name + ".") for b in blocks)]
    if not top:
        return params
    rest = max(0, params - sum(m.parameter_bytes for m in top))
    return max(max(m.parameter_bytes for m in top), rest)


def measured(profile: Profile) -> Measured:
    """The figures ``zero_model`` calibrates on, from one rank's profile."""
    cats = profile.categories_at_peak
    params = int(cats.get("parameter", 0))
    by_step = comm_steps(profile.collectives)
    reduces = {k: [c for c in v if c.op == "all_reduce"] for k, v in by_step.items()}
    return Measured(
        world=profile.world_size,
        peak_bytes=measured_peak(profile),
        parameter_bytes=params,
        gradient_bytes=int(cats.get("gradient", 0)),
        optimizer_state_bytes=int(cats.get("optimizer_state", 0)),
        largest_parameter_bytes=max((m.parameter_bytes for m in profile.modules if not profile.children(m.name)),
                                    default=0),
        largest_unit_bytes=largest_unit_bytes(profile, params),
        step_time_s=profile.step_time_s,
        optimizer_s=profile.phases.get("optimizer_s", 0.0),
        busbw=measured_busbw(profile),
        comm_s=median_per_step(by_step, "time_s") or None,
        exposed_s=median_per_step(by_step, "exposed_s") if by_step else None,
        grad_bytes_reduced=int(median_per_step(reduces, "bytes")) or None,
    )


def refusal(profile: Profile) -> str | None:
    """Why no stage can be applied to this job (None: it can)."""
    if profile.optimizer_count == 0:
        return "no optimizer of the job was identified"
    if profile.optimizer_count != 1:
        return f"{profile.optimizer_count} optimizers (the appliers shard exactly one, over the whole model)"
    if profile.data_parallel != "DistributedDataParallel":
        return f"the model is wrapped by {profile.data_parallel or 'nothing'}, not DistributedDataParallel"
    reasons = [checkpoint_refusal(profile.checkpoint_saves, stage) for stage in STAGES]
    if all(reasons):  # every stage ruled out by the script's saves: the remedy is, with each reason once
        return "; ".join(dict.fromkeys(r for r in reasons if r))
    return None


def propose(profile: Profile, finding: Finding) -> Proposal:
    """For a memory finding, the lowest ZeRO stage whose predicted peak fits its budget (its time
    cost predicted too); when none fits, the stage with the lowest peak, which does not fit; stages
    the job's checks refuse only when every stage is refused. Every
    stage's predicted peak and step time go into the evidence. For a communication finding of a
    ZeRO-3 job, a lower stage (``zero_lower.py``)."""
    if finding.rule == "communication":
        return lower_stage(profile)
    budget = finding.budget_bytes
    n = profile.world_size
    if not budget or n < 2 or int(profile.categories_at_peak.get("optimizer_state", 0)) <= 0:
        return Proposal()
    why = refusal(profile)
    if why is not None:
        if profile.data_parallel in ("DistributedDataParallel", None):
            return Proposal(evidence=(Evidence(what="ZeRO", value=f"not proposed: {why}"),))
        return Proposal()
    m = measured(profile)
    costs = []
    evidence: list[Evidence] = []
    for stage in STAGES:
        refused = checkpoint_refusal(profile.checkpoint_saves, stage)
        if refused:
            evidence.append(Evidence(what=f"ZeRO-{stage}", value=f"not proposed: {refused}"))
            continue
        cost = stage_cost(m, stage)
        if cost.peak_bytes >= m.peak_bytes:
            reason = ("the largest parameter holds so much of the state that the busiest rank would save "
                      "nothing" if stage == 1 else "gathered parameters outweigh what sharding saves")
            evidence.append(Evidence(what=f"ZeRO-{stage}", value=f"not proposed: {reason}"))
            continue
        costs.append(cost)
        time = fmt_seconds(cost.step_time_s) if cost.step_time_s is not None else "not predicted"
        evidence.append(Evidence(what=f"ZeRO-{stage} predicted", value=f"peak {gib(cost.peak_bytes)}, step {time}"
                                 + ("" if cost.peak_bytes <= budget else " (over the budget)")))
    if not costs:
        return Proposal(evidence=tuple(evidence))
    # A stage the job's checks refuse (ZeRO-2/3 on tied weights) is chosen only when every stage is:
    # the lowest peak of those that can apply is the one worth listing (and the joint plans build on).
    allowed = [c for c in costs if profile.refusal("zero", {"stage": c.stage}) is None] or costs
    fitting = [c for c in allowed if c.peak_bytes <= budget]
    chosen = fitting[0] if fitting else min(allowed, key=lambda c: (c.peak_bytes, c.stage))
    return Proposal(evidence=tuple(evidence),
                    recommendations=(_recommendation(profile, m, stage_cost(m, 0), chosen, budget),))


def _recommendation(profile: Profile, m: Measured, base: StageCost, cost: StageCost, budget: int) -> Recommendation:
    n, stage = m.world, cost.stage
    ev = [f"model states {gib(base.model_state_bytes)} per rank of a {gib(m.peak_bytes)} peak, replicated on {n} ranks "
          f"(parameters {gib(m.parameter_bytes)}, gradients {gib(m.gradient_bytes)}, optimizer state "
          f"{gib(m.optimizer_state_bytes)} at the peak)",
          f"ZeRO-{stage} keeps {gib(cost.model_state_bytes)} of them per rank: parameters {gib(cost.parameter_bytes)}, "
          f"gradients {gib(cost.gradient_bytes)}, optimizer state {gib(cost.optimizer_state_bytes)}; "
          f"{gib(m.peak_bytes - cost.peak_bytes)} less at the peak"]
    if cost.comm_s is not None and m.busbw:
        ev.append(f"collectives {fmt_seconds(cost.comm_s)} per step ({STAGE_TRAFFIC[stage]:g}x DDP's traffic"
                  + (", plus the owners' broadcast" if stage == 1 else "")
                  + f", at the measured {fmt_rate(m.busbw)} bus bandwidth), {fmt_seconds(cost.exposed_s)} "
                  f"exposed against {fmt_seconds(m.exposed_s or 0)} today")
    else:
        ev.append("step time not predicted: no all-reduce of this job was measured (comm probe off?)")
    host_synchronous = stage > 1 and n > 1 and profile.device_type == "cpu"
    if host_synchronous:
        ev.append(HOST_SYNCHRONOUS)
    note = checkpoint_note(profile.checkpoint_saves, stage)
    if note:
        ev.append(note)
    prereq = ["one optimizer holding exactly the DDP model's trainable parameters",
              CHECKPOINT_CAVEAT + ("" if profile.checkpoint_saves else
                                   " (no save of the model's or the optimizer's state was seen so far; the advisor "
                                   "watches torch.save and torch.distributed.checkpoint)")]
    if stage > 1:
        prereq.append("FSDP2 (torch.distributed.fsdp.fully_shard) shards each block and the root in place; "
                      "the DDP wrapper's forward is routed to the sharded module")
    title = {1: f"ZeRO-1: partition the optimizer state across the {n} data-parallel ranks",
             2: f"ZeRO-2: shard gradients and optimizer state across the {n} ranks (FSDP2, "
                "parameters kept gathered through backward)",
             3: f"ZeRO-3: shard parameters, gradients and optimizer state across the {n} ranks (FSDP2)"}[stage]
    return Recommendation(
        id=f"zero-{stage}",
        remedy=SPEC.name,
        title=title,
        params={"stage": stage},
        predicted=Prediction(peak_memory_bytes=cost.peak_bytes, step_time_s=cost.step_time_s),
        baseline=Prediction(peak_memory_bytes=m.peak_bytes, step_time_s=m.step_time_s),
        budget_bytes=budget,
        cost_model=COST_MODELS[stage],
        confidence="high" if m.busbw and stage == 1 else "medium" if m.busbw and not host_synchronous else "low",
        exact=stage == 1,
        live=True,
        apply_class=APPLY_CLASSES[stage],
        prerequisites=prereq,
        evidence=ev,
    )


SPEC = RemedySpec(
    name="zero",
    apply_class="live-exact",
    params=("stage",),
    validate=validate,
    phase="layout",
    addresses=("memory", "communication"),  # a sharded job bound by exposed communication: a lower stage
    propose=propose,
)
