"""Pipeline split, the predictor half: the recommendation from the planner's best partition.

The planner and its cost model are ``pipeline_planner.py``. For the memory rule, a chain that does
not fit one device, or runs faster split, gets a split over the devices one process sees (applied
live) or over the job's ranks (a restart: every rank's loop changes). For the pipeline-balance rule,
a running split whose measured stages are imbalanced gets a new one (``pipeline_repartition.py``).
The applier is ``apply/remedies/pipeline.py`` (``apply_pipeline(target, *, stages, micro_batches,
devices)``). Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec, pipeline_repartition
from advisor.recommend.remedies.pipeline_planner import (
    APPLY_CLASS_LIVE,
    APPLY_CLASS_MULTI_RANK,
    COST_MODEL,
    DEFAULT_LINK_BYTES_S,
    SCHEDULES,
    blocks_from_profile,
    loop_change,
    plan_pipeline,
)
from advisor.records.advice import Evidence, Prediction, Recommendation
from advisor.records.units import fmt_bytes, fmt_rate, fmt_seconds

PARAMS: tuple[str, ...] = ("stages", "micro_batches", "devices")  # apply_pipeline's keywords


def validate(params: Mapping[str, Any]) -> None:
    """Torch-free check of the live remedy's params: ``stages`` a list of p >= 2 non-empty lists of
    distinct module names, ``micro_batches`` an int >= 1, ``devices`` p device strings."""
    stages, m, devices = params.get("stages"), params.get("micro_batches"), params.get("devices")
    if not isinstance(stages, (list, tuple)) or len(stages) < 2 or not all(
            isinstance(s, (list, tuple)) and s and all(isinstance(n, str) and n for n in s) for s in stages):
        raise ValueError(f"stages must be a list of two or more non-empty lists of module names, not {stages!r}")
    names = [n for s in stages for n in s]
    if len(set(names)) != len(names):
        raise ValueError(f"stages name a module twice: {names!r}")
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"micro_batches must be an integer >= 1, not {m!r}")
    if not isinstance(devices, (list, tuple)) or len(devices) != len(stages) or not all(
            isinstance(d, str) and d for d in devices):
        raise ValueError(f"devices must list one device string per stage ({len(stages)}), not {devices!r}")


def propose_split(
    profile: Profile,
    budget: int | None,
    *,
    devices: int,
    world_size: int = 1,
    device_type: str = "cuda",
    link_bytes_s: float | None = None,
    batch_size: int | None = None,
) -> Proposal:
    """A pipeline split of the model's chain of blocks, or nothing (the reason in the evidence).

    ``devices``: devices visible to one process; ``world_size``: ranks of the job. A single-process
    job seeing two or more devices gets a ``live-equivalent`` recommendation whose params are
    ``apply_pipeline``'s keywords (``stages``, ``micro_batches``, ``devices``; GPipe, the schedule an
    unmodified loop can run). A multi-rank job (p = ``world_size`` stages) gets a ``restart`` one
    whose params carry the partition, schedule, ``split_points`` and the per-rank ``loop_change``;
    nothing is applied. ``budget``: bytes per device (None: the profile's budget).

    Proposed when the job does not fit one device and the split fits, or when the split is
    predicted faster than the measured step.
    """
    budget = budget or profile.budget_bytes
    p = world_size if world_size > 1 else devices
    blocks = blocks_from_profile(profile)
    if p < 2 or len(blocks) < 2:
        return _not_proposed(f"{p} device(s), {len(blocks)} chained blocks")
    p = min(p, len(blocks))
    link = link_bytes_s or DEFAULT_LINK_BYTES_S
    baseline_peak = measured_peak(profile)
    chain_bytes = sum(2 * b.parameter_bytes + b.optimizer_bytes + b.activation_bytes for b in blocks)
    rest = max(0, baseline_peak - chain_bytes)  # embedding, head, inputs, temporaries: stay on stage 0
    multi = world_size > 1
    plan = plan_pipeline(blocks, stages=p, memory_bytes=budget, bandwidth_bytes_s=link,
                         schedules=SCHEDULES if multi else ("gpipe",), batch_size=batch_size,
                         extra_bytes=[rest] + [0] * (p - 1))
    best, naive = plan.best, plan.naive
    other = max(0.0, (profile.step_time_s or plan.serial_step_s) - plan.serial_step_s)
    predicted_step = other + best.step_time_s
    fits_one = budget is None or baseline_peak <= budget
    faster = profile.step_time_s is not None and predicted_step < profile.step_time_s
    if not best.feasible or (fits_one and not faster):
        return _not_proposed("no partition fits the devices" if not best.feasible
                             else "not predicted faster than one device")
    stages = [list(s) for s in best.stages]
    ev = [
        f"{len(blocks)} blocks in {p} stages {[len(s) for s in stages]}, {best.micro_batches} micro-batches, "
        f"{best.schedule}: slowest stage {fmt_seconds(max(best.stage_time_s))}, imbalance {best.imbalance:.2f}, "
        f"bubble {best.bubble_fraction:.0%}",
        f"equal-layer split {[len(s) for s in naive.stages]}: slowest stage {fmt_seconds(max(naive.stage_time_s))}, "
        f"imbalance {naive.imbalance:.2f}, step {fmt_seconds(naive.step_time_s)} against "
        f"{fmt_seconds(best.step_time_s)}, largest stage peak {fmt_bytes(naive.max_peak_bytes)}",
        f"peak per stage {', '.join(fmt_bytes(b) for b in best.peak_bytes)} against "
        + (f"{fmt_bytes(budget)} per device" if budget else "no known device memory"),
        f"point-to-point {fmt_bytes(best.p2p_bytes)} per step over a link of {fmt_rate(link)}"
        + ("" if link_bytes_s else " (assumed: no link was measured)"),
    ]
    common: dict[str, Any] = dict(
        predicted=Prediction(peak_memory_bytes=best.max_peak_bytes, step_time_s=predicted_step),
        baseline=Prediction(peak_memory_bytes=baseline_peak, step_time_s=profile.step_time_s),
        budget_bytes=budget,
        cost_model=f"dp: {COST_MODEL}",
        confidence="medium" if link_bytes_s and profile.oom is None else "low",
        exact=False,
        curve=None,
    )
    if multi:
        cls = APPLY_CLASS_MULTI_RANK
        params = {"stages": stages, "micro_batches": best.micro_batches, "schedule": best.schedule,
                  "ranks": p, "split_points": [s[0] for s in stages[1:]], "loop_change": loop_change(best)}
        title = (f"Pipeline over {p} ranks ({best.schedule}, {best.micro_batches} micro-batches): "
                 f"peak {fmt_bytes(best.max_peak_bytes)} per rank; every rank's loop changes (restart)")
        extra = dict(live=False, prerequisites=["change the training loop on every rank as loop_change shows",
                                                "build the optimizer over the rank's stage parameters"],
                     evidence=ev + ["per-rank loop:\n" + params["loop_change"]])
    else:
        cls = APPLY_CLASS_LIVE
        params = {"stages": stages, "micro_batches": best.micro_batches,
                  "devices": [f"{device_type}:{i}" for i in range(p)]}
        title = (f"Pipeline the {len(blocks)} blocks over {p} devices in this process ({best.micro_batches} "
                 f"micro-batches): peak {fmt_bytes(best.max_peak_bytes)} per device, "
                 f"step {fmt_seconds(predicted_step)}")
        extra = dict(live=True, prerequisites=[
            "each block feeds the next; no BatchNorm in the blocks; the batch splits along its first dimension",
            "micro-batching reassociates sums (live-equivalent)"], evidence=ev)
    extra["apply_class"] = cls
    return Proposal(recommendations=(Recommendation(id=f"pipeline-{p}x{best.micro_batches}", remedy=SPEC_NAME,
                                                    title=title, params=params, **common, **extra),))


def _not_proposed(why: str) -> Proposal:
    return Proposal(evidence=(Evidence(what="pipeline split", value=f"not proposed: {why}"),))


def propose(profile: Profile, finding: Finding) -> Proposal:
    """For the memory rule, a first split over the devices and ranks the profile says the job has;
    for the balance rule, a new split of the running one (``pipeline_repartition.py``)."""
    if finding.rule == "pipeline_balance":
        return pipeline_repartition.propose(profile)
    if not finding.budget_bytes:
        return Proposal()
    return propose_split(profile, finding.budget_bytes, devices=profile.visible_devices,
                         world_size=profile.world_size, device_type=profile.device_type)


SPEC_NAME = "pipeline"
SPEC = RemedySpec(
    name=SPEC_NAME,
    apply_class=APPLY_CLASS_LIVE,  # one process over its devices; a multi-rank split is "restart" per record
    params=PARAMS,  # the live form's, apply_pipeline's keywords: a multi-rank split is never applied
    validate=validate,
    phase="layout",
    addresses=("memory", "pipeline_balance"),
    propose=propose,
)
