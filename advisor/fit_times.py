"""A fit's step time: the ops it counted against the target's roofline, the collectives against its links.

Fake tensors take no time, so a fit's measured times mean nothing; its counted FLOPs and bytes do.
Each op is timed as the roofline bounds it, ``max(FLOPs / peak of its dtype, bytes / memory
bandwidth)`` with the target's spec-table ceilings (REFERENCE.md, Roofline): a lower bound that
no kernel beats, reached by large matrix products and missed by small ones. Each collective is
timed at the target's nominal link bandwidth with nccl-tests' bus factor (``bandwidth.bus_factor``:
all-reduce moves 2(n-1)/n of its bytes per rank), on the network when its group spans nodes; the
collectives are taken to overlap the passes they can overlap (an all-reduce or reduce-scatter the
backward pass, an all-gather the forward and backward), and what exceeds them is added to the step.

``with_roofline_times`` gives the session's records those times (steps, phases, modules, ops,
collectives), so the recommender's cost models see the target's times, not the fake run's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from advisor.recommend.roofline import peak_for
from advisor.records.bandwidth import bus_factor
from advisor.records.fit import FitSettings
from advisor.records.samples import CollectiveStat, ModuleStat, OpStat, StepSample
from advisor.state import SessionState

_OVERLAP = {"all_reduce": ("backward",), "reduce_scatter": ("backward",), "all_gather": ("forward", "backward")}
PHASE_OF_OP = {"forward": "forward_s", "backward": "backward_s", "optimizer": "optimizer_s", "other": "other_s"}


@dataclass(frozen=True, kw_only=True)
class RooflineStep:
    """One step of the job on the target, as the roofline bounds it (seconds)."""

    counted_step: int | None  # the step whose ops were counted
    flops: float
    bytes: float
    by_phase: dict[str, float]  # StepSample phase keys -> seconds of ops
    compute_s: float
    collectives_s: float  # at the links' nominal bandwidth, none overlapped
    exposed_s: float  # the collectives' part the passes cannot hide
    op_seconds: dict[int, float] = field(default_factory=dict)  # id(OpStat) -> seconds
    collective_seconds: dict[int, float] = field(default_factory=dict)  # id(CollectiveStat) -> seconds
    bandwidth_unknown: bool = False  # no memory bandwidth for the target: ops timed on FLOPs alone

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_s

    def to_dict(self) -> dict[str, Any]:
        return {"statistic": "roofline estimate (lower bound: every op at its roof)",
                "counted_step": self.counted_step, "flops": self.flops, "bytes": self.bytes,
                "by_phase": dict(self.by_phase), "compute_s": self.compute_s,
                "collectives_s": self.collectives_s, "collectives_exposed_s": self.exposed_s,
                "step_s": self.step_s, "step_s_no_overlap": self.compute_s + self.collectives_s}


def op_seconds(op: OpStat, peak_flops: Mapping[str, float], bandwidth: float | None) -> float:
    """The roofline time of one aggregated op signature on the target (all its calls)."""
    peak = peak_for(op.dtype, peak_flops)
    compute = op.flops / peak if peak else 0.0
    memory = op.bytes / bandwidth if bandwidth else 0.0
    return max(compute, memory)


def collective_seconds(call: CollectiveStat, fit: FitSettings) -> float | None:
    """A collective's time at the target's nominal bandwidth (None without a GPU target)."""
    device = fit.device
    if device is None:
        return None
    try:
        factor = bus_factor(call.op, max(1, call.group_size))
    except ValueError:
        return 0.0  # a barrier, a monitored wait: no bytes to move
    spans_nodes = call.group_size > fit.nproc_per_node
    bandwidth = device.network_bandwidth if spans_nodes else device.link_bandwidth
    return call.bytes * factor / bandwidth


def _rank(records: list[Any]) -> int | None:
    ranks = {r.rank for r in records}
    return 0 if 0 in ranks else (min(ranks) if ranks else None)


def roofline_step(state: SessionState, spec: Mapping[str, Any] | None, fit: FitSettings) -> RooflineStep:
    """The step of ``state``'s lowest rank timed on the target (see the module docstring)."""
    peak_flops = dict((spec or {}).get("peak_flops") or {})
    bandwidth = (spec or {}).get("memory_bandwidth")
    rank = _rank(state.ops)
    ops = [o for o in state.ops if o.rank == rank]
    counted = max((o.step for o in ops), default=None)
    ops = [o for o in ops if o.step == counted]
    times = {id(o): op_seconds(o, peak_flops, bandwidth) for o in ops}
    by_phase = dict.fromkeys(PHASE_OF_OP.values(), 0.0)
    for op in ops:
        by_phase[PHASE_OF_OP.get(op.phase, "other_s")] += times[id(op)]
    calls = _step_collectives(state, counted)
    call_times = {id(c): collective_seconds(c, fit) or 0.0 for c in calls}
    exposed = 0.0
    for op_name, phases in sorted({c.op: _OVERLAP.get(c.op, ()) for c in calls}.items()):
        total = sum(call_times[id(c)] for c in calls if c.op == op_name)
        exposed += max(0.0, total - sum(by_phase[f"{p}_s"] for p in phases))
    return RooflineStep(counted_step=counted, flops=float(sum(o.flops for o in ops)),
                        bytes=float(sum(o.bytes for o in ops)), by_phase=by_phase,
                        compute_s=sum(by_phase.values()), collectives_s=sum(call_times.values()),
                        exposed_s=exposed, op_seconds=times, collective_seconds=call_times,
                        bandwidth_unknown=not bandwidth)


def _step_collectives(state: SessionState, counted: int | None) -> list[CollectiveStat]:
    """The lowest rank's collectives of one training step: the counted step's, else the latest
    step's after the first (step 0 holds set-up broadcasts)."""
    rank = _rank(state.collectives)
    calls = [c for c in state.collectives if c.rank == rank]
    steps = sorted({c.step for c in calls})
    if not steps:
        return []
    chosen = counted if counted in steps else max(s for s in steps if s > 0) if any(s > 0 for s in steps) else steps[0]
    return [c for c in calls if c.step == chosen]


def with_roofline_times(state: SessionState, step: RooflineStep) -> SessionState:
    """``state`` with every time replaced by the roofline's (see the module docstring): what the
    recommender's cost models read for the job on the target."""
    out = copy.copy(state)
    phases = {**step.by_phase, "data_s": 0.0}
    phases["other_s"] = phases.get("other_s", 0.0) + step.exposed_s
    out.steps = {rank: [_timed_step(s, phases, step) for s in samples] for rank, samples in state.steps.items()}
    out.ops = [replace(o, time_s=step.op_seconds.get(id(o), 0.0)) for o in state.ops]
    exposure = step.exposed_s / step.collectives_s if step.collectives_s > 0 else 0.0
    out.collectives = [replace(c, time_s=step.collective_seconds.get(id(c), 0.0),
                               exposed_s=step.collective_seconds.get(id(c), 0.0) * exposure, wait_s=0.0)
                       for c in state.collectives]
    out.modules = _timed_modules(state.modules, state.ops, step)
    return out


def _timed_step(sample: StepSample, phases: dict[str, float], step: RooflineStep) -> StepSample:
    optimizers = list(sample.optimizer_s) or []
    share = phases["optimizer_s"] / len(optimizers) if optimizers else 0.0
    return replace(sample, time_s=step.step_s, phases=dict(phases), device_time_s=None, eval_s=0.0,
                   module_forward_s={}, module_recompute_s={},
                   optimizer_s={label: share for label in optimizers})


def _timed_modules(modules: list[ModuleStat], ops: list[OpStat], step: RooflineStep) -> list[ModuleStat]:
    """Each module's forward and backward time: the roofline times of the ops run inside it."""
    totals: dict[tuple[str, str], float] = {}
    for op in ops:
        seconds = step.op_seconds.get(id(op))
        if seconds is None or op.phase not in ("forward", "backward"):
            continue
        parts = op.module.split(".") if op.module else []
        for depth in range(len(parts) + 1):  # the op counts for its module and each enclosing one
            name = ".".join(parts[:depth])
            totals[(name, op.phase)] = totals.get((name, op.phase), 0.0) + seconds
    return [replace(m, forward_s=totals.get((m.name, "forward"), 0.0), backward_s=totals.get((m.name, "backward"), 0.0))
            for m in modules]
