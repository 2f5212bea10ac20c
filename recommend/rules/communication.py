"""Communication-bound rule: exposed collective time above ``EXPOSED_SHARE`` of the step under
DDP or FSDP. Its remedies (``recommend/remedies``: ``ddp_bucket``, ``grad_compression``,
``grad_accumulation``, and ``zero``'s lower stage for a ZeRO-3 job) read ``comm_figures``.

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

from dataclasses import dataclass

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.recommend.rules._figures import bus_bandwidth, bus_factor, comm_steps, median_per_step, ms
from advisor.records.advice import Evidence, Prediction, Recommendation
from advisor.records.units import fmt_bytes, fmt_rate

NAME = "communication"
EXPOSED_SHARE = 0.10  # exposed collective time above this share of the step: communication-bound
DATA_PARALLEL = ("DistributedDataParallel", "FullyShardedDataParallel", "fully_shard")


@dataclass(frozen=True, kw_only=True)
class CommFigures:
    """What the communication rule measured per step (seconds, bytes) on a data-parallel job."""

    step_s: float  # the profile's step (median of light steps): what predictions start from
    comm_step_s: float  # the step the share is of: the comm section's median of ordinary steps
    exposed_s: float
    share: float  # exposed / comm_step_s
    comm_s: float
    grad_bytes: float  # all-reduced or reduce-scattered per step
    grad_calls: float
    busbw: float | None  # bytes/s on the bus (largest call), None without a timed multi-rank call
    transfer_s: float  # T_bw: the gradient bytes at the measured bus bandwidth
    latency_s: float  # L: the gradient calls' time beyond T_bw
    ddp: bool  # DDP's all-reduce (the wrapper seen, or ranks reducing gradient bytes with none seen)

    def lines(self) -> list[str]:
        return [f"{ms(self.exposed_s)} of collectives exposed in a {ms(self.comm_step_s)} step ({self.share:.0%}; "
                "medians of ordinary steps)",
                f"{fmt_bytes(self.grad_bytes)} reduced per step in {self.grad_calls:g} call(s)"
                + (f" at {fmt_rate(self.busbw)} bus bandwidth" if self.busbw else "")]


def comm_figures(profile: Profile) -> CommFigures | None:
    """The per-step figures of a data-parallel job's collectives; None without collectives."""
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
    grads = [c for calls in by_step.values() for c in calls if c.op in ("all_reduce", "reduce_scatter")]
    grad_bytes = sum(c.bytes for c in grads) / max(1, len(by_step))
    busbw = bus_bandwidth(profile.collectives)
    n = max((c.group_size for c in profile.collectives), default=profile.world_size)
    t_bw = grad_bytes * bus_factor("all_reduce", n) / busbw if busbw else 0.0
    grad_time = sum(c.time_s for c in grads) / max(1, len(by_step))
    return CommFigures(step_s=step, comm_step_s=shown_step, exposed_s=exposed, share=share, comm_s=comm_time,
                       grad_bytes=grad_bytes, grad_calls=sum(c.count for c in grads) / max(1, len(by_step)),
                       busbw=busbw, transfer_s=t_bw, latency_s=max(0.0, grad_time - t_bw),
                       # Ranks with no wrapper seen are taken for DDP only when they reduce gradient
                       # bytes: a tensor-parallel job (DTensor, no DDP, 0 B reduced) was told to
                       # accumulate under no_sync, which it does not have.
                       ddp=wrapper == "DistributedDataParallel"
                       or (wrapper is None and profile.world_size > 1 and grad_bytes > 0))


def communication_rule(profile: Profile) -> Finding | None:
    figures = comm_figures(profile)
    if figures is None or figures.share <= EXPOSED_SHARE:
        return None
    evidence = (
        Evidence(what="exposed collective time / step time", value=round(figures.share, 4), threshold=EXPOSED_SHARE),
        Evidence(what="exposed collective time per step", value=round(figures.exposed_s, 6), unit="s"),
        Evidence(what="collective time per step", value=round(figures.comm_s, 6), unit="s"),
        Evidence(what="step time (median of ordinary steps)", value=round(figures.comm_step_s, 6), unit="s"),
        Evidence(what="gradient bytes reduced per step", value=int(figures.grad_bytes), unit="B"),
        Evidence(what="bus bandwidth (largest call)", value=round(figures.busbw, 1) if figures.busbw else None,
                 unit="B/s"),
    )
    return Finding(rule=NAME, bottleneck="communication",
                   summary=f"exposed communication takes {figures.share:.0%} of the step", severity=figures.share,
                   evidence=evidence, no_remedy=f"none applies to {profile.data_parallel or 'this setup'}")


def recommend(figures: CommFigures, *, budget_bytes: int | None, **kw: object) -> Recommendation:
    """A recommendation against the measured step (no remedy of this rule predicts its peak)."""
    return Recommendation(baseline=Prediction(peak_memory_bytes=None, step_time_s=figures.step_s),
                          budget_bytes=budget_bytes, evidence=figures.lines(), **kw)  # type: ignore[arg-type]


RULE = communication_rule
