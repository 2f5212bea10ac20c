"""Repartition a job that already pipelines: a new split from the measured per-stage times.

The planner (``pipeline.py``) splits a chain by the blocks' measured forward and backward times on
one device. Once the chain runs as a pipeline the stages' own times are measured (the in-process
pipeline's per-stage timeline, ``PipelineHandle.stage_times()``: whole-batch forward seconds of
each stage's worker), and they can disagree with the sum of their blocks' times (another device,
the copies between devices, contention). So the blocks are first *calibrated*: every block of
stage s has its forward and backward scaled by

    r_s = measured_s / sum_{i in s} forward_s_i          (backward assumed to scale as forward)

which makes the model's stage compute equal to what was measured. The scale follows the blocks:
a block measured slow stays slow wherever it moves (a stage slow because of its device rather than
its blocks is not told apart; the applier's devices are all one kind). Then the same exact DP
(``min_max_partition``) chooses the new split under the same m, schedule and memory, and both
are evaluated with ``evaluate``: the predicted gain is 1 - step(new) / step(current).

Proposed when the measured imbalance (max / mean of the measured stage times) is at least
``IMBALANCE`` and the predicted gain at least ``MIN_GAIN``. A single-process job gets a
``live-equivalent`` recommendation whose params are ``apply_pipeline``'s: applied to a chain that
is already pipelined, it moves the blocks whose stage changes to their new device at a step
boundary (``revert()`` moves them back). A multi-rank job gets a ``restart`` one with the new split
points and the per-rank loop. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from advisor.recommend.finding import Proposal
from advisor.recommend.profile import Profile
from advisor.recommend.remedies.pipeline_planner import (
    APPLY_CLASS_LIVE,
    APPLY_CLASS_MULTI_RANK,
    COST_MODEL,
    DEFAULT_LINK_BYTES_S,
    PartitionFigures,
    PipeBlock,
    blocks_from_profile,
    evaluate,
    loop_change,
    min_max_partition,
)
from advisor.records.advice import Evidence, Prediction, Recommendation
from advisor.records.units import fmt_seconds

IMBALANCE = 1.10  # measured slowest / mean stage time from which a new split is considered
MIN_GAIN = 0.05  # predicted step-time gain below which moving blocks is not worth a boundary


@dataclass(frozen=True, kw_only=True)
class Repartition:
    """The current split (calibrated to the measured stage times) and the proposed one."""

    current: PartitionFigures
    proposed: PartitionFigures
    measured_stage_s: tuple[float, ...]
    measured_imbalance: float
    scale: tuple[float, ...]  # r_s per current stage

    @property
    def gain(self) -> float:
        """Predicted share of the chain's step time saved (0.2: 20% faster)."""
        return 1.0 - self.proposed.step_time_s / self.current.step_time_s if self.current.step_time_s > 0 else 0.0


def bounds_of(blocks: Sequence[PipeBlock], stages: Sequence[Sequence[str]]) -> tuple[int, ...]:
    """The bounds of a split given as lists of block names, which must cover the chain in order."""
    names = [b.name for b in blocks]
    flat = [n for s in stages for n in s]
    if flat != names or any(not s for s in stages):
        raise ValueError(f"the stages {[list(s) for s in stages]} do not split the chain {names} in order")
    bounds = [0]
    for s in stages:
        bounds.append(bounds[-1] + len(s))
    return tuple(bounds)


def calibrate(blocks: Sequence[PipeBlock], bounds: Sequence[int], measured_stage_s: Sequence[float]) -> list[PipeBlock]:
    """The blocks with each stage's forward and backward scaled so the stage's forward sum equals
    its measured time (a stage whose blocks have no forward time is left as it was)."""
    if len(measured_stage_s) != len(bounds) - 1:
        raise ValueError(f"{len(measured_stage_s)} measured stage times for {len(bounds) - 1} stages")
    if any(t < 0 for t in measured_stage_s):
        raise ValueError(f"measured stage times must be >= 0, got {list(measured_stage_s)}")
    out = list(blocks)
    for s, measured in enumerate(measured_stage_s):
        i, j = bounds[s], bounds[s + 1]
        modelled = sum(b.forward_s for b in blocks[i:j])
        r = measured / modelled if modelled > 0 else 1.0
        for k in range(i, j):
            out[k] = replace(blocks[k], forward_s=blocks[k].forward_s * r, backward_s=blocks[k].backward_s * r)
    return out


def repartition(
    blocks: Sequence[PipeBlock],
    stages: Sequence[Sequence[str]],
    measured_stage_s: Sequence[float],
    *,
    micro_batches: int,
    schedule: str = "gpipe",
    memory_bytes: Sequence[float] | float | None = None,
    bandwidth_bytes_s: float = DEFAULT_LINK_BYTES_S,
    extra_bytes: Sequence[float] | float | None = None,
) -> Repartition:
    """The calibrated current split and the DP's split of the calibrated chain (the current one
    when nothing else fits)."""
    bounds = bounds_of(blocks, stages)
    fitted = calibrate(blocks, bounds, measured_stage_s)
    common: dict[str, Any] = dict(micro_batches=micro_batches, schedule=schedule, memory_bytes=memory_bytes,
                                  bandwidth_bytes_s=bandwidth_bytes_s, extra_bytes=extra_bytes)
    current = evaluate(fitted, bounds, **common)
    new = min_max_partition(fitted, len(stages), **common) or bounds
    proposed = evaluate(fitted, new, **common)
    if max(proposed.stage_time_s) >= max(current.stage_time_s):
        proposed = current  # ties keep the blocks where they are
    mean = sum(measured_stage_s) / len(measured_stage_s)
    return Repartition(current=current, proposed=proposed, measured_stage_s=tuple(measured_stage_s),
                       measured_imbalance=max(measured_stage_s) / mean if mean > 0 else 1.0,
                       scale=tuple(sum(f.forward_s for f in fitted[bounds[s]:bounds[s + 1]])
                                   / (sum(b.forward_s for b in blocks[bounds[s]:bounds[s + 1]]) or 1.0)
                                   for s in range(len(stages))))


def propose_repartition(
    blocks: Sequence[PipeBlock],
    stages: Sequence[Sequence[str]],
    measured_stage_s: Sequence[float],
    *,
    micro_batches: int,
    devices: Sequence[str] = (),
    world_size: int = 1,
    schedule: str = "gpipe",
    memory_bytes: Sequence[float] | float | None = None,
    bandwidth_bytes_s: float | None = None,
    extra_bytes: Sequence[float] | float | None = None,
    step_time_s: float | None = None,
) -> Proposal:
    """One recommendation to move blocks between the stages of a running pipeline, or none (the
    reason in the evidence). ``devices``: the in-process pipeline's stage devices (single process);
    ``world_size`` > 1: the job pipelines over ranks (restart). ``step_time_s``: the measured step,
    whose part outside the chain is carried over unchanged."""
    link = bandwidth_bytes_s or DEFAULT_LINK_BYTES_S
    plan = repartition(blocks, stages, measured_stage_s, micro_batches=micro_batches, schedule=schedule,
                       memory_bytes=memory_bytes, bandwidth_bytes_s=link, extra_bytes=extra_bytes)
    cur, new = plan.current, plan.proposed
    imbalance = Evidence(what="measured pipeline stage imbalance", value=round(plan.measured_imbalance, 3),
                         threshold=IMBALANCE)
    if plan.measured_imbalance < IMBALANCE:
        return Proposal(evidence=(imbalance,))
    if new.bounds == cur.bounds or plan.gain < MIN_GAIN:
        return Proposal(evidence=(imbalance, Evidence(what="pipeline repartition", threshold=MIN_GAIN,
                                                      value=f"not proposed: predicted gain {plan.gain:.1%}")))
    multi = world_size > 1
    if not multi and len(devices) != len(stages):
        raise ValueError(f"devices must list one device per stage ({len(stages)}), not {list(devices)!r}")
    other = max(0.0, step_time_s - cur.step_time_s) if step_time_s is not None else 0.0
    sizes = lambda f: [len(s) for s in f.stages]  # noqa: E731
    ev = [f"measured stage forward times {', '.join(fmt_seconds(t) for t in measured_stage_s)}: imbalance "
          f"{plan.measured_imbalance:.2f}",
          f"split {sizes(cur)} -> {sizes(new)}: slowest stage {fmt_seconds(max(cur.stage_time_s))} -> "
          f"{fmt_seconds(max(new.stage_time_s))}, predicted step {fmt_seconds(cur.step_time_s)} -> "
          f"{fmt_seconds(new.step_time_s)} ({plan.gain:.0%} faster)",
          "blocks calibrated per stage to the measured times (x" + ", x".join(f"{r:.2f}" for r in plan.scale) + ")"]
    moved = sum(1 for a, b in zip(_stage_of(cur), _stage_of(new)) if a != b)
    params: dict[str, Any] = {"stages": [list(s) for s in new.stages], "micro_batches": micro_batches}
    if multi:
        params.update(schedule=schedule, ranks=len(stages), split_points=[s[0] for s in new.stages[1:]],
                      loop_change=loop_change(new))
        cls, live = APPLY_CLASS_MULTI_RANK, False
        prerequisites = ["move the split points on every rank as loop_change shows, then restart"]
    else:
        params["devices"] = list(devices)
        cls, live = APPLY_CLASS_LIVE, True
        prerequisites = ["the chain is pipelined in this process (the pipeline remedy is in force)"]
    budget = memory_bytes if isinstance(memory_bytes, (int, float)) else None
    return Proposal(evidence=(imbalance,), recommendations=(Recommendation(
        id=f"pipeline-repartition-{'-'.join(str(n) for n in sizes(new))}",
        remedy="pipeline",
        title=f"Rebalance the pipeline: move {moved} block(s), stages {sizes(cur)} -> {sizes(new)}, "
              f"{plan.gain:.0%} faster predicted",
        params=params,
        predicted=Prediction(peak_memory_bytes=new.max_peak_bytes, step_time_s=other + new.step_time_s),
        baseline=Prediction(peak_memory_bytes=cur.max_peak_bytes, step_time_s=step_time_s),
        budget_bytes=None if budget is None else int(budget),
        cost_model=f"dp over measured stage times: {COST_MODEL}",
        confidence="medium",
        exact=False,
        live=live,
        apply_class=cls,
        prerequisites=prerequisites,
        evidence=ev,
    ),))


def _stage_of(figures: PartitionFigures) -> list[int]:
    return [s for s in range(len(figures.bounds) - 1) for _ in range(figures.bounds[s], figures.bounds[s + 1])]


def propose(profile: Profile) -> Proposal:
    """A new split of the running one (``Profile.pipeline``). The blocks are the profile's measured
    chain when it names the split's blocks; otherwise (their module stats predate the split) each
    stage's measured time is shared equally by its blocks and no memory limit is known."""
    info = profile.pipeline
    if info is None:
        return Proposal()
    stages = [list(s) for s in info.stages]
    times = list(info.stage_times_s)
    if len(stages) < 2 or len(times) != len(stages) or min(times) <= 0:
        return Proposal()  # no forward measured since the split (or its last change)
    measured = {b.name: b for b in blocks_from_profile(profile)}
    names = [n for s in stages for n in s]
    if all(n in measured for n in names):
        blocks, memory = [measured[n] for n in names], profile.budget_bytes
    else:
        blocks = [PipeBlock(name=n, forward_s=t / len(s), backward_s=2 * t / len(s), activation_bytes=0,
                            parameter_bytes=0, optimizer_bytes=0, output_bytes=0)
                  for s, t in zip(stages, times) for n in s]
        memory = None
    return propose_repartition(blocks, stages, times, micro_batches=info.micro_batches, devices=list(info.devices),
                               memory_bytes=memory, step_time_s=profile.step_time_s)
