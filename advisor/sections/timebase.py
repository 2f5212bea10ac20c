"""One time base for every per-op and per-module time: an ordinary (light) step.

Deep-sampled steps run under the probes (dispatch modes, the profiler), so the times measured
on them are inflated against an ordinary step. The report shows every op and module time
normalised to an ordinary step and keeps the figure measured on the profiled step beside it,
labelled ``profiled_*``. The factor is ``light / profiled`` for the matching stretch of time,
clamped to (0, 1]: a probe never makes an op faster.
"""

from __future__ import annotations

import statistics

from advisor.recommend.profile import light_forward
from advisor.records.samples import StepSample, ordinary_steps
from advisor.state import SessionState


def light_samples(state: SessionState) -> list[StepSample]:
    """Rank 0's ordinary steps (``ordinary_steps``) that are light, after step 0 and of positive
    time: none when the rank has no such step (its fallbacks are the profiled steps)."""
    return [s for s in ordinary_steps(state.rank0_steps()) if not s.deep and s.index > 0 and s.time_s > 0]


def light_step_time(state: SessionState) -> float | None:
    """Median wall time of an ordinary step (``StepSample.time_s``, seconds), or None."""
    times = [s.time_s for s in light_samples(state)]
    return statistics.median(times) if times else None


def light_phase_time(state: SessionState, phase: str) -> float | None:
    """Median time of one phase (``"forward_s"``, ...) on ordinary steps, seconds, or None."""
    values = [s.phases[phase] for s in light_samples(state) if s.phases.get(phase)]
    return statistics.median(values) if values else None


def light_module_times(state: SessionState, key: str = "module_forward_s") -> dict[str, float]:
    """Median seconds of each module timed on ordinary steps (sampled one light step in N), by
    qualified name: the forward (``module_forward_s``), or with ``key="module_recompute_s"`` what
    a checkpoint of it runs again, up to its last saved tensor. The figures the cost models read."""
    return light_forward(state.rank0_steps(), key)


def scale(light_s: float | None, profiled_s: float | None) -> float:
    """``light / profiled``, at most 1; 1.0 when either is unknown."""
    if not light_s or not profiled_s or profiled_s <= 0:
        return 1.0
    return min(1.0, light_s / profiled_s)
