"""Communication-bound rule: exposed collective time above ``EXPOSED_SHARE`` of the step under
DDP or FSDP; it proposes a larger DDP bucket, gradient compression and gradient accumulation.

Evidence (``Profile.comm``: one rank's medians over its ordinary steps, the figures of the
report's ``comm`` section): the exposed time per step (``CollectiveStat.exposed_s``: the part no
computation overlapped) over the step time, the collective time per step; from
``Profile.collectives`` (every step but DDP's start-up step 0) the bytes per step and the bus
bandwidth of the largest call (bytes x 2(n-1)/n / time for an all-reduce, REFERENCE.md).

Prediction, per step, with ``T_bw = bytes x factor / bus bandwidth`` (the transfer at the measured
bandwidth) and ``L = gradient-call time - T_bw`` (what they cost beyond it: per-call latency):
- bucket x4: one call in four, so ``L`` shrinks to a quarter; exposed' = max(0, exposed - 3L/4).
- compression to 16 bits: ``T_bw`` halves; exposed' = max(0, exposed - T_bw / 2).
- accumulation of k micro-batches under ``no_sync``: one all-reduce per k; per micro-batch the
  step costs ``step - exposed (1 - 1/k)``.
The overlap that remains is what the remedy does not remove: the figures above never go below 0.
"""

from __future__ import annotations

import math

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import ddp_bucket, grad_accumulation, grad_compression
from advisor.recommend.rules._figures import bus_bandwidth, bus_factor, comm_steps, median_per_step, ms
from advisor.records.advice import Prediction, Recommendation
from advisor.records.units import fmt_bytes, fmt_rate

EXPOSED_SHARE = 0.10  # exposed collective time above this share of the step: communication-bound
DDP_DEFAULT_BUCKET_MB = 25  # torch's default bucket_cap_mb
BUCKET_GROWTH = 4  # the larger bucket proposed: this many times the default
DATA_PARALLEL = ("DistributedDataParallel", "FullyShardedDataParallel", "fully_shard")


def _rec(**kw: object) -> Recommendation:
    step = kw.pop("step")
    return Recommendation(baseline=Prediction(peak_memory_bytes=None, step_time_s=step), fits=True,
                          **kw)  # type: ignore[arg-type]


def communication_rule(profile: Profile) -> Finding | None:
    step = profile.step_time_s
    wrapper = profile.data_parallel
    if not step or not profile.collectives or (wrapper not in DATA_PARALLEL and profile.world_size <= 1):
        return None
    by_step = comm_steps(profile.collectives)
    figures = profile.comm
    if figures is not None and figures.step_time_s > 0:
        # The figures the report's comm section shows for this rank: medians over the same
        # ordinary steps, exposed over that median step. A mean exposed time over a median step
        # read 87% where the section read 69%, and a median over deep steps too differed from both.
        exposed, comm_time, share, shown_step = (figures.exposed_s, figures.comm_s, figures.exposed_share,
                                                 figures.step_time_s)
    else:  # a profile without its steps (built by hand): the calls' per-step medians
        exposed, comm_time = median_per_step(by_step, "exposed_s"), median_per_step(by_step, "time_s")
        share, shown_step = exposed / step, step
    if share <= EXPOSED_SHARE:
        return None
    grads = [c for calls in by_step.values() for c in calls if c.op in ("all_reduce", "reduce_scatter")]
    grad_bytes = sum(c.bytes for c in grads) / max(1, len(by_step))
    calls = sum(c.count for c in grads) / max(1, len(by_step))
    busbw = bus_bandwidth(profile.collectives)
    n = max((c.group_size for c in profile.collectives), default=profile.world_size)
    t_bw = grad_bytes * bus_factor("all_reduce", n) / busbw if busbw else 0.0
    grad_time = sum(c.time_s for c in grads) / max(1, len(by_step))
    latency = max(0.0, grad_time - t_bw)
    evidence = [
        {"what": "exposed collective time / step time", "value": round(share, 4), "threshold": EXPOSED_SHARE},
        {"what": "exposed collective time per step", "value": round(exposed, 6), "unit": "s"},
        {"what": "collective time per step", "value": round(comm_time, 6), "unit": "s"},
        {"what": "step time (median of ordinary steps)", "value": round(shown_step, 6), "unit": "s"},
        {"what": "gradient bytes reduced per step", "value": int(grad_bytes), "unit": "B"},
        {"what": "bus bandwidth (largest call)", "value": round(busbw, 1) if busbw else None, "unit": "B/s"},
    ]
    lines = [f"{ms(exposed)} of collectives exposed in a {ms(shown_step)} step ({share:.0%}; medians of "
             "ordinary steps)",
             f"{fmt_bytes(grad_bytes)} reduced per step in {calls:g} call(s)"
             + (f" at {fmt_rate(busbw)} bus bandwidth" if busbw else "")]
    recs: list[Recommendation] = []
    ddp = wrapper == "DistributedDataParallel" or (wrapper is None and profile.world_size > 1)
    if ddp:
        cap = DDP_DEFAULT_BUCKET_MB * BUCKET_GROWTH
        saved = min(exposed, latency * (1 - 1 / BUCKET_GROWTH)) if calls > 1 else 0.0
        if saved > 0:
            recs.append(_rec(
                id="ddp-bucket", remedy=ddp_bucket.SPEC.name, step=step,
                title=f"Larger DDP buckets ({cap} MiB): fewer all-reduce calls per step",
                params={"bucket_cap_mb": cap},
                predicted=Prediction(peak_memory_bytes=None, step_time_s=step - saved),
                cost_model=f"per-call cost beyond bytes / bus bandwidth ({ms(latency)}) cut to 1/{BUCKET_GROWTH}",
                confidence="low", exact=True, live=False, apply_class=ddp_bucket.SPEC.apply_class,
                prerequisites=[f"change: DistributedDataParallel(model, ..., bucket_cap_mb={cap})",
                               "restart: DDP fixes its buckets when it is built"],
                evidence=lines))
        if t_bw > 0:
            saved = min(exposed, t_bw / 2)
            recs.append(_rec(
                id="grad-compression", remedy=grad_compression.SPEC.name, step=step,
                title="Compress gradients to bf16 for the all-reduce (DDP communication hook)",
                params={"dtype": "bf16"},
                predicted=Prediction(peak_memory_bytes=None, step_time_s=step - saved),
                cost_model=f"half the bytes: transfer {ms(t_bw)} at the measured bus bandwidth halves",
                confidence="medium", exact=False, live=True, apply_class=grad_compression.SPEC.apply_class,
                prerequisites=["your consent: it changes numerics (gradients summed in bf16): "
                               "--allow-inexact headless, or confirm it in the TUI",
                               "the advisor's delegating hook, installed on every DDP object it sees built "
                               "(not with agent config comm_switch: false)"],
                evidence=lines))
        k = max(2, math.ceil(share / EXPOSED_SHARE))
        k = 2 ** math.ceil(math.log2(k))
        recs.append(_rec(
            id="grad-accumulation", remedy=grad_accumulation.SPEC.name, step=step,
            title=f"Accumulate {k} micro-batches under no_sync: one all-reduce per {k} (step time per micro-batch)",
            params={"micro_batches": k},
            predicted=Prediction(peak_memory_bytes=None, step_time_s=step - exposed * (1 - 1 / k)),
            cost_model=f"per micro-batch: step - exposed x (1 - 1/{k})",
            confidence="medium", exact=False, live=False, apply_class=grad_accumulation.SPEC.apply_class,
            prerequisites=[f"change: {grad_accumulation.change(k)}"], evidence=lines))
    summary = f"exposed communication takes {share:.0%} of the step"
    if not recs:
        summary += f" (no remedy for {wrapper or 'this setup'} here: a lower ZeRO stage would need the zero remedy)"
    return Finding(bottleneck="communication", summary=summary, severity=share, evidence=evidence,
                   recommendations=recs)


RULE = communication_rule
