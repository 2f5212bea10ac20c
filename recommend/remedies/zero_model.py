"""Per-rank memory and step time of a DDP job under ZeRO stage 0-3 (pure; no SPEC: a helper of
``zero.py``).

Memory (REFERENCE.md, "ZeRO", with the measured categories at the peak instead of 2Ψ/2Ψ/KΨ:
P parameters, G gradients, S optimizer state, N the data-parallel degree; sizes in bytes):

    stage 0 (DDP)   P + G + S
    stage 1         P + G + S/N + s_max           (the applier's partition: s_max is the state of
                                                   the largest parameter, the busiest rank's excess)
    stage 2         P/N + P + G/N + S/N           (FSDP2, reshard_after_forward=False: every unit's
                                                   gathered parameters stay from forward to backward,
                                                   beside the sharded ones)
    stage 3         P/N + 2u + G/N + S/N          (FSDP2, reshard_after_forward=True: one unit
                                                   gathered at a time, plus the one prefetched;
                                                   u the largest unit's parameter bytes)

    At N = 1 FSDP2 gathers nothing: its unsharded parameters are the sharded ones (torch's
    FSDPParamGroup.unshard returns early for a group of one), so the gathered terms (P in stage
    2, 2u in stage 3) are 0. An H200 measured stage 2 at one rank within 0.6% of DDP's peak,
    where the gathered term had predicted +15%.

    peak'(k) = measured peak - (P + G + S) + model_states(k)

Everything else at the peak (activations, temporaries, inputs, DDP's gradient buckets, which
stay allocated under FSDP2) is taken as measured. In fp32 the sharded parameters of FSDP2 are
also its master copy, so the table's 2Ψ fp16 parameters become P + P/N in stage 2.

Communication per step, in bytes each rank moves (nccl-tests' bus bytes; REFERENCE.md,
"Communication"), with g the gradient bytes all-reduced today (P when none was measured):

    stage 0, 1   all-reduce g: 2(N-1)/N g                    (stage 1 adds a broadcast of P: P)
    stage 2      reduce-scatter g + all-gather P in forward: 2(N-1)/N g   (1x DDP's)
    stage 3      + all-gather P again in backward: 3(N-1)/N g             (1.5x DDP's)

Time: each figure at the measured bus bandwidth; the share of it that hides behind compute is
today's (1 - exposed / collective time of the measured steps), except the stage 1 broadcast,
which runs after the optimizer step with nothing beside it. The optimizer step updates 1/N of
the parameters in every stage above 0:

    step'(k) = step - exposed + exposed'(k) - optimizer_s (1 - 1/N)
"""

from __future__ import annotations

from dataclasses import dataclass

STAGE_TRAFFIC = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.5}  # collective bytes per step against DDP's


@dataclass(frozen=True, kw_only=True)
class StageCost:
    """Predicted per-rank figures of one ZeRO stage (bytes; seconds, None when not predictable)."""

    stage: int
    parameter_bytes: int  # at the peak: sharded plus gathered
    gradient_bytes: int
    optimizer_state_bytes: int
    peak_bytes: int
    comm_s: float | None  # collective time per step
    exposed_s: float | None  # the part of it not hidden behind compute
    step_time_s: float | None

    @property
    def model_state_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_state_bytes


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What the prediction is calibrated on (one rank of a DDP job; bytes and seconds)."""

    world: int
    peak_bytes: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    largest_parameter_bytes: int  # the largest single parameter (stage 1's imbalance)
    largest_unit_bytes: int  # the largest FSDP unit's parameters (stage 3's gathered unit)
    step_time_s: float | None
    optimizer_s: float
    busbw: float | None  # bytes/s, nccl-tests' bus bandwidth of this job's all-reduces
    comm_s: float | None  # collective time per step today
    exposed_s: float | None  # exposed collective time per step today
    grad_bytes_reduced: int | None  # all-reduced bytes per step today


def stage_cost(m: Measured, stage: int) -> StageCost:
    """The figures of ZeRO-``stage`` (0 is the job as measured); formulas in the module docstring."""
    if stage not in STAGE_TRAFFIC:
        raise ValueError(f"ZeRO stage {stage!r}; valid: {sorted(STAGE_TRAFFIC)}")
    n, p, g, s = m.world, m.parameter_bytes, m.gradient_bytes, m.optimizer_state_bytes
    if stage == 0:
        params, grads, state = p, g, s
    elif stage == 1:
        extra = s * m.largest_parameter_bytes // p if p else 0
        params, grads, state = p, g, s // n + extra
    elif stage == 2:
        params, grads, state = p // n + (p if n > 1 else 0), g // n, s // n
    else:
        params, grads, state = p // n + (min(p, 2 * m.largest_unit_bytes) if n > 1 else 0), g // n, s // n
    peak = m.peak_bytes - (p + g + s) + params + grads + state
    comm, exposed, step = _time(m, stage)
    return StageCost(stage=stage, parameter_bytes=params, gradient_bytes=grads, optimizer_state_bytes=state,
                     peak_bytes=peak, comm_s=comm, exposed_s=exposed, step_time_s=step)


def _time(m: Measured, stage: int) -> tuple[float | None, float | None, float | None]:
    n = m.world
    if not m.busbw or n < 2:
        return None, None, None
    reduced = m.grad_bytes_reduced if m.grad_bytes_reduced else m.parameter_bytes
    ddp_s = reduced * 2.0 * (n - 1) / n / m.busbw
    # Today's measured collective time is the reference where there is one: it carries the
    # per-call costs the bus-bandwidth model leaves out. Scale it by the stage's traffic.
    base_s = m.comm_s if m.comm_s else ddp_s
    hidden = 1.0 - (m.exposed_s / m.comm_s) if m.comm_s and m.exposed_s is not None else 0.0
    hidden = min(max(hidden, 0.0), 1.0)
    comm = base_s * STAGE_TRAFFIC[stage]
    exposed = comm * (1.0 - hidden)
    if stage == 1:  # owners broadcast every parameter after the step: nothing overlaps it
        broadcast = m.parameter_bytes / m.busbw
        comm += broadcast
        exposed += broadcast
    if m.step_time_s is None:
        return comm, exposed, None
    today_exposed = m.exposed_s if m.exposed_s is not None else base_s
    optimizer_saved = m.optimizer_s * (1 - 1 / n) if stage else 0.0
    return comm, exposed, m.step_time_s - today_exposed + exposed - optimizer_saved
