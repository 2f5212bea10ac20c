"""The pipeline planner: a balanced partition of a chain of blocks over p stages, and its figures.

Cost model (REFERENCE.md, "Pipelines"), for a chain of blocks split into p contiguous stages and a
batch split into m micro-batches:

    stage time   T_s = sum_{i in s} (forward_s_i + backward_s_i) + 2 * y_last(s) / bandwidth
                 (whole batch; the send of the stage's output forward and of its gradient back,
                 over the link to the next stage; the last stage sends nothing)
    step time    (m + p - 1) * max_s T_s / m       (GPipe and 1F1B: the bubble is (p-1)/(m+p-1))
    peak of s    2 * params_s + optimizer_s + extra_s + kept_s * (act_s + y_in(s)) / m + y_last(s) / m
                 (parameters and their gradients, optimizer state, what the stage's device holds
                 beyond its blocks, the activations of the micro-batches kept for backward with the
                 received input copy its first block keeps (y_in: the previous block's output; none
                 for stage 0), and one outgoing micro-batch of output)
    kept_s       GPipe: m (every micro-batch's forward runs before any backward);
                 1F1B: min(m, p - s) (stage s holds at most p - s forwards in flight)
    imbalance    max_s T_s / mean_s T_s
    point-to-point bytes per step: 2 * sum over stage boundaries of y_last(s) (activation and gradient)

The partition minimising max_s T_s subject to every stage's peak fitting its device is found by
dynamic programming over contiguous ranges (PipeDream's planner; exact for chains): best[k][j] =
min_i max(best[k-1][i], T(i..j-1)) over the ranges whose peak fits stage k. T does not depend on m,
but the 1F1B peak does, so the DP runs once per (schedule, m) candidate; numpy evaluates each stage
over all (i, j) ranges at once. The chosen plan has the least predicted step time, then the least
peak; the naive equal-layer split is evaluated with the same m and schedule beside it.

The remedy that proposes splits is ``pipeline.py`` (a first split for the memory rule) with
``pipeline_repartition.py`` (a new split of a running pipeline for the balance rule). Nothing here
imports torch.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from advisor.recommend.memory_model import find_chain
from advisor.recommend.profile import Profile

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b")
COST_MODEL = ("step = (m+p-1)/m * max stage (fwd+bwd+2*out/bw); stage peak = 2*params + optimizer + "
              "kept micro-batches * activations/m (GPipe m, 1F1B min(m, p-s)) (REFERENCE.md, Pipelines)")
DEFAULT_LINK_BYTES_S = 25e9  # PCIe 4.0 x16, one direction: the link assumed when none was measured


@dataclass(frozen=True, kw_only=True)
class PipeBlock:
    """One block of the chain, measured over a whole batch (bytes; seconds of an ordinary step)."""

    name: str
    forward_s: float
    backward_s: float
    activation_bytes: int  # saved for backward by the block and its descendants
    parameter_bytes: int
    optimizer_bytes: int  # optimizer state of the block's parameters
    output_bytes: int

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclass(frozen=True, kw_only=True)
class PartitionFigures:
    """One partition with its predictions. ``bounds``: start index of each stage, then n."""

    bounds: tuple[int, ...]
    stages: tuple[tuple[str, ...], ...]
    micro_batches: int
    schedule: str
    stage_time_s: tuple[float, ...]  # whole batch: forward + backward + sends
    peak_bytes: tuple[int, ...]
    step_time_s: float  # the chain's part of the step, bubble included
    bubble_fraction: float
    imbalance: float
    p2p_bytes: int
    feasible: bool  # every stage's peak fits its device

    @property
    def max_peak_bytes(self) -> int:
        return max(self.peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bounds": list(self.bounds),
            "stages": [list(s) for s in self.stages],
            "micro_batches": self.micro_batches,
            "schedule": self.schedule,
            "stage_time_s": list(self.stage_time_s),
            "peak_bytes": list(self.peak_bytes),
            "step_time_s": self.step_time_s,
            "bubble_fraction": self.bubble_fraction,
            "imbalance": self.imbalance,
            "p2p_bytes": self.p2p_bytes,
            "feasible": self.feasible,
        }


@dataclass(frozen=True, kw_only=True)
class PipelinePlan:
    """The planner's choice and the naive equal-layer split under the same m and schedule."""

    best: PartitionFigures
    naive: PartitionFigures
    serial_step_s: float  # the chain on one device, no pipeline: sum of forward + backward
    method: str = "dp"
    candidates: int = 0  # (schedule, m) pairs whose DP ran (the others were bounded out)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best.to_dict(), "naive": self.naive.to_dict(), "serial_step_s": self.serial_step_s,
                "method": self.method, "candidates": self.candidates, "extra": dict(self.extra)}


# ------------------------------------------------------------------ the cost model ---------
class _Chain:
    """Prefix sums of a chain, so any range's figures cost O(1) (and vectorise over ranges)."""

    def __init__(self, blocks: Sequence[PipeBlock]) -> None:
        if not blocks:
            raise ValueError("the chain is empty: a pipeline needs at least one block per stage")
        self.blocks = tuple(blocks)
        self.n = len(blocks)

        def prefix(values: list[float]) -> np.ndarray:
            return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=np.float64))))

        self.compute = prefix([b.compute_s for b in blocks])
        self.params = prefix([b.parameter_bytes for b in blocks])
        self.optim = prefix([b.optimizer_bytes for b in blocks])
        self.act = prefix([b.activation_bytes for b in blocks])
        self.out = np.asarray([b.output_bytes for b in blocks], dtype=np.float64)


def _kept(schedule: str, m: int, p: int, stage: int) -> int:
    """Micro-batches of activations stage ``stage`` keeps for backward."""
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(m, p - stage)
    raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")


def _range_time(c: _Chain, i: np.ndarray | int, j: np.ndarray | int, last: bool, bandwidth: float) -> Any:
    """Whole-batch time of stage [i, j): compute, plus the output and its gradient over the link."""
    t = c.compute[j] - c.compute[i]
    if not last:
        t = t + 2.0 * c.out[np.asarray(j) - 1] / bandwidth
    return t


def _range_peak(c: _Chain, i: Any, j: Any, *, stage: int, p: int, m: int, schedule: str, extra: float) -> Any:
    """Peak bytes of stage [i, j) (see the module docstring)."""
    kept = _kept(schedule, m, p, stage)
    model_states = 2.0 * (c.params[j] - c.params[i]) + (c.optim[j] - c.optim[i])
    i = np.asarray(i)
    inbound = np.where(i > 0, c.out[np.maximum(i, 1) - 1], 0.0)  # received copies the first block keeps
    return extra + model_states + kept * (c.act[j] - c.act[i] + inbound) / m + c.out[np.asarray(j) - 1] / m


def _per_stage(values: Sequence[float] | float | None, p: int, what: str) -> list[float]:
    if values is None:
        return [math.inf] * p if what == "memory" else [0.0] * p
    if isinstance(values, (int, float)):
        return [float(values)] * p
    out = [float(v) for v in values]
    if len(out) != p:
        raise ValueError(f"{what} has {len(out)} entries; valid: one per stage ({p})")
    return out


def evaluate(
    blocks: Sequence[PipeBlock],
    bounds: Sequence[int],
    *,
    micro_batches: int,
    schedule: str,
    memory_bytes: Sequence[float] | float | None = None,
    bandwidth_bytes_s: float = DEFAULT_LINK_BYTES_S,
    extra_bytes: Sequence[float] | float | None = None,
) -> PartitionFigures:
    """The predictions of one partition (``bounds`` = 0, starts of stages 1.., n)."""
    c = _Chain(blocks)
    bounds = tuple(int(b) for b in bounds)
    p = len(bounds) - 1
    if p < 1 or bounds[0] != 0 or bounds[-1] != c.n or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"bounds {list(bounds)} do not split {c.n} blocks into non-empty contiguous stages")
    m = int(micro_batches)
    if m < 1:
        raise ValueError(f"micro_batches={micro_batches}; valid: 1 or more")
    memory = _per_stage(memory_bytes, p, "memory")
    extra = _per_stage(extra_bytes, p, "extra_bytes")
    times, raw = [], []
    for s in range(p):
        i, j = bounds[s], bounds[s + 1]
        times.append(float(_range_time(c, i, j, s == p - 1, bandwidth_bytes_s)))
        raw.append(float(_range_peak(c, i, j, stage=s, p=p, m=m, schedule=schedule, extra=extra[s])))
    peaks = [int(round(r)) for r in raw]
    slowest = max(times)
    mean = sum(times) / p
    return PartitionFigures(
        bounds=bounds,
        stages=tuple(tuple(b.name for b in c.blocks[bounds[s]:bounds[s + 1]]) for s in range(p)),
        micro_batches=m,
        schedule=schedule,
        stage_time_s=tuple(times),
        peak_bytes=tuple(peaks),
        step_time_s=(m + p - 1) * slowest / m,
        bubble_fraction=(p - 1) / (m + p - 1),
        imbalance=slowest / mean if mean > 0 else 1.0,
        p2p_bytes=int(2 * sum(c.out[bounds[s + 1] - 1] for s in range(p - 1))),
        feasible=all(r <= mem for r, mem in zip(raw, memory)),  # unrounded, as the DP compares
    )


def equal_split(n: int, p: int) -> tuple[int, ...]:
    """The naive partition: p runs of n/p blocks (the first n mod p runs one longer)."""
    if not 1 <= p <= n:
        raise ValueError(f"cannot split {n} blocks into {p} non-empty stages; valid: 1..{n} stages")
    size, rest = divmod(n, p)
    bounds = [0]
    for s in range(p):
        bounds.append(bounds[-1] + size + (1 if s < rest else 0))
    return tuple(bounds)


def min_max_partition(
    blocks: Sequence[PipeBlock],
    stages: int,
    *,
    micro_batches: int,
    schedule: str,
    memory_bytes: Sequence[float] | float | None = None,
    bandwidth_bytes_s: float = DEFAULT_LINK_BYTES_S,
    extra_bytes: Sequence[float] | float | None = None,
    objective: str = "time",
) -> tuple[int, ...] | None:
    """Exact DP: the bounds minimising the slowest stage's time (``objective="time"``) among
    partitions whose every stage fits, or the largest overshoot of a stage's peak over its memory
    (``"peak"``: every partition allowed; the largest peak when there is no limit). None when no
    partition fits."""
    c = _Chain(blocks)
    n, p, m = c.n, int(stages), int(micro_batches)
    if not 1 <= p <= n:
        raise ValueError(f"cannot split {n} blocks into {p} non-empty stages; valid: 1..{n} stages")
    memory = _per_stage(memory_bytes, p, "memory")
    extra = _per_stage(extra_bytes, p, "extra_bytes")
    idx = np.arange(n + 1)
    i_grid, j_grid = np.meshgrid(idx, idx, indexing="ij")  # cost[i, j] for the range [i, j)
    valid = i_grid < j_grid
    j_safe = np.maximum(j_grid, 1)
    best = np.full(n + 1, np.inf)
    best[0] = -np.inf  # overshoots may be negative: nothing before the first stage bounds them
    choice = np.zeros((p, n + 1), dtype=np.int64)
    for s in range(p):
        last = s == p - 1
        peak = _range_peak(c, i_grid, j_safe, stage=s, p=p, m=m, schedule=schedule, extra=extra[s])
        if objective == "time":
            cost = _range_time(c, i_grid, j_safe, last, bandwidth_bytes_s)
            cost = np.where(valid & (peak <= memory[s]), cost, np.inf)
        elif objective == "peak":  # the largest overshoot of a stage's memory (its peak with no limit)
            cost = np.where(valid, peak - (memory[s] if math.isfinite(memory[s]) else 0.0), np.inf)
        else:
            raise ValueError(f"objective {objective!r}; valid: time, peak")
        total = np.maximum(best[:, None], cost)  # [i, j]
        choice[s] = np.argmin(total, axis=0)
        best = total[choice[s], idx]
    if not math.isfinite(best[n]):
        return None
    bounds = [n]
    for s in range(p - 1, -1, -1):
        bounds.append(int(choice[s][bounds[-1]]))
    return tuple(reversed(bounds))


def micro_batch_choices(stages: int, batch_size: int | None = None, limit: int | None = None) -> list[int]:
    """m to try: 1 .. 4p (REFERENCE.md: the bubble is small once m >= 4p), dividing the batch if known."""
    top = limit or 4 * stages
    if batch_size:
        top = min(top, batch_size)
        return [m for m in range(1, top + 1) if batch_size % m == 0]
    return list(range(1, top + 1))


def plan_pipeline(
    blocks: Sequence[PipeBlock],
    *,
    stages: int,
    memory_bytes: Sequence[float] | float | None = None,
    bandwidth_bytes_s: float = DEFAULT_LINK_BYTES_S,
    schedules: Sequence[str] = SCHEDULES,
    micro_batches: Sequence[int] | None = None,
    batch_size: int | None = None,
    extra_bytes: Sequence[float] | float | None = None,
) -> PipelinePlan:
    """The partition, m and schedule with the least predicted step time whose stages all fit.

    ``memory_bytes``: per device (one number for all, a list per stage, or None for no limit).
    ``schedules``: those the job can run (the in-process pipeline runs GPipe only).
    ``micro_batches``: the m to try (default ``micro_batch_choices``). ``extra_bytes``: what each
    stage's device holds beyond its blocks (the modules outside the chain, inputs, temporaries).
    When nothing fits, ``best`` is the partition closest to fitting (``feasible`` False).
    """
    for s in schedules:
        _kept(s, 1, 1, 0)  # rejects an unknown schedule
    if not schedules:
        raise ValueError(f"no schedule given; valid: {', '.join(SCHEDULES)}")
    n = len(blocks)
    ms = sorted(set(micro_batches)) if micro_batches else micro_batch_choices(stages, batch_size)
    common = dict(memory_bytes=memory_bytes, bandwidth_bytes_s=bandwidth_bytes_s, extra_bytes=extra_bytes)

    def best_split(m: int, schedule: str, objective: str = "time", limits: bool = True) -> PartitionFigures | None:
        """The DP's partition for one (m, schedule), evaluated; None when none fits."""
        kw: dict[str, Any] = common if limits else {"bandwidth_bytes_s": bandwidth_bytes_s}
        bounds = min_max_partition(blocks, stages, micro_batches=m, schedule=schedule, objective=objective, **kw)
        return None if bounds is None else evaluate(blocks, bounds, micro_batches=m, schedule=schedule, **kw)

    # Branch and bound, still exact: no candidate beats (m+p-1)/m times the slowest stage of the
    # partition found without a memory limit, so candidates are tried by that bound and the rest
    # skipped once it exceeds the best step time found.
    free = best_split(1, schedules[0], limits=False)
    assert free is not None
    floor = max(free.stage_time_s)
    # Each stage's kept share (kept/m) falls as m grows, so the largest m has the least overshoot
    # under each schedule: when even that partition does not fit, no candidate does.
    lean = [best_split(ms[-1], schedule, "peak") for schedule in schedules]
    assert all(f is not None for f in lean)  # the peak objective allows every partition
    order = sorted(itertools.product(schedules, ms), key=lambda c: (c[1] + stages - 1) / c[1])
    found: list[PartitionFigures] = []
    tried = len(schedules)
    for schedule, m in order if any(f.feasible for f in lean if f) else ():
        if found and (m + stages - 1) / m * floor > min(f.step_time_s for f in found) * (1 + 1e-12):
            break
        tried += 1
        figures = best_split(m, schedule)
        if figures is not None:
            found.append(figures)
    if found:
        best = min(found, key=lambda f: (f.step_time_s, f.max_peak_bytes, f.micro_batches))
    else:  # nothing fits: the partition closest to fitting
        best = min((f for f in lean if f), key=lambda f: (max(pk - mem for pk, mem in zip(f.peak_bytes, _per_stage(
            memory_bytes, stages, "memory"))), f.step_time_s))
    naive = evaluate(blocks, equal_split(n, stages), micro_batches=best.micro_batches, schedule=best.schedule, **common)
    return PipelinePlan(best=best, naive=naive, serial_step_s=sum(b.compute_s for b in blocks), candidates=tried)


def brute_force(
    blocks: Sequence[PipeBlock],
    stages: int,
    *,
    micro_batches: int,
    schedule: str,
    memory_bytes: Sequence[float] | float | None = None,
    bandwidth_bytes_s: float = DEFAULT_LINK_BYTES_S,
    extra_bytes: Sequence[float] | float | None = None,
) -> PartitionFigures | None:
    """Every contiguous partition evaluated (small chains only: C(n-1, p-1) of them); tests and the
    benchmark check the DP against it."""
    n = len(blocks)
    best: PartitionFigures | None = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        figures = evaluate(blocks, (0, *cuts, n), micro_batches=micro_batches, schedule=schedule,
                           memory_bytes=memory_bytes, bandwidth_bytes_s=bandwidth_bytes_s, extra_bytes=extra_bytes)
        if figures.feasible and (best is None or max(figures.stage_time_s) < max(best.stage_time_s)):
            best = figures
    return best


# ------------------------------------------------------------------ the recommendation ------
APPLY_CLASS_LIVE = "live-equivalent"  # micro-batching reassociates sums; nothing else changes
APPLY_CLASS_MULTI_RANK = "restart"  # every rank's loop must change: never applied live
_ADAM_STATE = 2.0  # optimizer state per parameter byte when the profile has no optimizer category


def blocks_from_profile(profile: Profile) -> list[PipeBlock]:
    """The chain of sibling blocks (``memory_model.find_chain``) as planner input, at ordinary-step
    times; optimizer state per block follows the measured optimizer-state / parameter ratio."""
    cats = profile.categories_max or profile.categories_at_peak
    ratio = cats["optimizer_state"] / cats["parameter"] if cats.get("parameter") and "optimizer_state" in cats \
        else _ADAM_STATE
    return [
        PipeBlock(
            name=m.name,
            forward_s=m.forward_s * profile.time_scale,
            backward_s=m.backward_s * profile.time_scale,
            activation_bytes=profile.subtree_activation(m.name),
            parameter_bytes=m.parameter_bytes,
            optimizer_bytes=int(m.parameter_bytes * ratio),
            output_bytes=m.output_bytes,
        )
        for m in find_chain(profile)
    ]


def loop_change(figures: PartitionFigures, model: str = "model") -> str:
    """The per-rank code a multi-rank job needs (torch.distributed.pipelining), split points included."""
    split = ", ".join(f'"{stage[0]}": SplitPoint.BEGINNING' for stage in figures.stages[1:])
    cls = "ScheduleGPipe" if figures.schedule == "gpipe" else "Schedule1F1B"
    return "\n".join([
        "from torch.distributed.pipelining import pipeline, SplitPoint, " + cls,
        f"pipe = pipeline({model}, mb_args=(x.tensor_split({figures.micro_batches})[0],),",
        f"                split_spec={{{split}}})",
        "stage = pipe.build_stage(rank, device)  # this rank's blocks only",
        "optimizer = <your optimizer>(stage.submod.parameters(), ...)",
        f"schedule = {cls}(stage, n_microbatches={figures.micro_batches}, loss_fn=loss_fn)",
        "# each step, instead of loss = loss_fn(model(x), y); loss.backward():",
        "optimizer.zero_grad()",
        "if rank == 0:",
        "    schedule.step(x)",
        f"elif rank == {len(figures.stages) - 1}:",
        "    losses = []",
        "    schedule.step(target=y, losses=losses)  # loss = torch.stack(losses).mean()",
        "else:",
        "    schedule.step()",
        "optimizer.step()",
    ])
