"""ZeRO stage 1 on a DDP job, the predictor half: spec, memory and time model, proposal.

Memory (REFERENCE.md, "ZeRO"): stage 1 partitions the optimizer state across the N_d
data-parallel ranks. The applier balances the partition by parameter bytes, largest first, so
the busiest rank holds at most 1/N_d of the state plus the state of one parameter (the
largest); the prediction is that bound, for the busiest rank:

    peak' = peak - optimizer_state * (1 - 1/N_d) + optimizer_state * largest_parameter / parameters

Time: DDP's gradient all-reduce is unchanged; each rank's optimizer step now updates 1/N_d of
the parameters, and after it each owner broadcasts its updated parameters, Ψ parameter bytes in
all, which nothing overlaps:

    step' = step - optimizer_s * (1 - 1/N_d) + parameter_bytes / bus bandwidth

with the bus bandwidth this job measured on its own all-reduces (the comm probe's collectives,
nccl-tests' convention; a broadcast's bus factor is 1). Without measured collectives the time is
not predicted. The applier is ``apply/remedies/zero.py`` (stage 1 only: stages 2 and 3 through
FSDP2 are not built yet); numerics are unchanged, so it is ``live-exact``.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from advisor.recommend.finding import gib
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.records.advice import Prediction, Recommendation
from advisor.records.bandwidth import busbw

STAGES = (1,)
COST_MODEL = ("peak - optimizer state x (1 - 1/N_d) + the largest parameter's state; step - optimizer step "
              "x (1 - 1/N_d) + parameter bytes / measured bus bandwidth (owners broadcast after each step)")


def parse_stage(value: Any) -> int:
    """The ZeRO stage as an int; ``ValueError`` naming the built stages."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in STAGES:
        raise ValueError(f"ZeRO stage {value!r} is not built; valid: {list(STAGES)} (2 and 3 need FSDP2, not built yet)")
    return value


def validate(params: Mapping[str, Any]) -> None:
    parse_stage(params.get("stage"))


def measured_busbw(profile: Profile) -> float | None:
    """Median bus bandwidth (bytes/s) of this job's all-reduces, from ``CollectiveStat`` records."""
    values = [busbw(c.op, c.bytes, c.time_s, c.group_size) for c in profile.collectives
              if c.op == "all_reduce" and c.bytes > 0 and c.time_s > 0 and c.group_size > 1]
    values = [v for v in values if v]
    return statistics.median(values) if values else None


def propose(profile: Profile, budget: int, evidence: list[dict[str, object]]) -> list[Recommendation]:
    """ZeRO-1 when a DDP job's optimizer state is a share of its peak worth partitioning."""
    n = profile.world_size
    state = int(profile.categories_at_peak.get("optimizer_state", 0))
    if n < 2 or profile.data_parallel != "DistributedDataParallel" or state <= 0:
        return []
    if profile.optimizer_count != 1:
        evidence.append({"what": "ZeRO-1", "value": f"not proposed: {profile.optimizer_count} optimizers "
                                                    "(the applier partitions exactly one)"})
        return []
    baseline_peak = measured_peak(profile)
    params = int(profile.categories_at_peak.get("parameter", 0))
    largest = max((m.parameter_bytes for m in profile.modules if not profile.children(m.name)), default=0)
    imbalance = int(state * largest / params) if params else 0
    saved = int(state * (1 - 1 / n)) - imbalance
    if saved <= 0:
        evidence.append({"what": "ZeRO-1", "value": "not proposed: the largest parameter holds so much of the "
                                                    "state that the busiest rank would save nothing"})
        return []
    peak = baseline_peak - saved
    bw = measured_busbw(profile)
    step = profile.step_time_s
    extra = params / bw if bw and params else None
    optimizer_saved = profile.phases.get("optimizer_s", 0.0) * (1 - 1 / n)
    predicted_time = step - optimizer_saved + extra if step is not None and extra is not None else None
    ev = [f"optimizer state {gib(state)} of a {gib(baseline_peak)} peak, replicated on {n} ranks",
          f"ZeRO-1 keeps about 1/{n} of it per rank: {gib(saved)} less at the peak"]
    ev.append(f"owners broadcast {gib(params)} of parameters after each step at the measured "
              f"{bw / 1e9:.2f} GB/s bus bandwidth: +{extra * 1e3:.1f} ms" if extra is not None else
              "step time not predicted: no all-reduce of this job was measured (comm probe off?)")
    return [Recommendation(
        id="zero-1",
        remedy=SPEC.name,
        title=f"ZeRO-1: partition the optimizer state across the {n} data-parallel ranks",
        params={"stage": 1},
        predicted=Prediction(peak_memory_bytes=peak, step_time_s=predicted_time),
        baseline=Prediction(peak_memory_bytes=baseline_peak, step_time_s=step),
        cost_model=COST_MODEL,
        confidence="high" if bw else "medium",
        exact=True,
        live=True,
        apply_class=SPEC.apply_class,
        prerequisites=["one optimizer holding exactly the DDP model's trainable parameters",
                       "while it is in force each rank's optimizer.state_dict() holds only its own share: "
                       "a checkpoint of the optimizer needs every rank's file (or revert first)"],
        evidence=ev,
        fits=peak <= budget,
    )]


SPEC = RemedySpec(
    name="zero",
    apply_class="live-exact",
    params=("stage",),
    validate=validate,
    phase="layout",
    addresses="memory",
    propose=propose,
)
