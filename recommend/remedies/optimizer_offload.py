"""Optimizer-state offload, the predictor half, and the CPU-optimizer-step plan.

Live offload (``apply/remedies/optimizer_offload.py``): the state lives on the host between
steps and comes back for ``step()``; the peak loses the state bytes; the step itself is
predicted with parameters + gradients + state on the device (conservative: for per-parameter
optimizers the applier steps in chunks, with a few chunks of state up at a time); time: 2 x
state bytes / host-link bandwidth (the chunks overlap the step's own compute, which is not
subtracted). Values are copied bit for bit: ``live-exact``. Proposed when model
states are the largest category at the peak.

The CPU-step plan (ZeRO-Offload style, ``cpu_step_plan``): state and step on the host, gradients
down and parameters up (about 4 x parameter count bytes in 16 bits per step, REFERENCE.md), so
the device holds parameters, gradients and activations only. It needs a host optimizer in the
script (a restart): ``restart`` class, no applier.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import gib
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.remedies.offload import bandwidth_of, model_for, optimizer_cost
from advisor.records.advice import Prediction, Recommendation
from advisor.records.units import fmt_rate, fmt_seconds

CPU_ADAM_BYTES_PER_S = 2e9  # state bytes a host Adam step updates per second (assumed, several cores)


def validate(params: Mapping[str, Any]) -> None:
    """``optimizers``: absent or null (all captured optimizers), or a list of indexes."""
    value = params.get("optimizers")
    if value is None:
        return
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) \
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise ValueError(f"optimizers must be null (all) or a list of indexes >= 0, not {value!r}")


def _categories(profile: Profile) -> dict[str, int]:
    cats = dict(profile.categories_at_peak or profile.categories_max)
    if profile.oom and profile.oom.get("categories"):
        cats = {k: int(v) for k, v in profile.oom["categories"].items()}
    return cats


def model_states_dominate(profile: Profile) -> bool:
    """Parameters + gradients + optimizer state are more than any other category at the peak."""
    cats = _categories(profile)
    states = sum(cats.get(k, 0) for k in ("parameter", "gradient", "optimizer_state"))
    rest = {k: v for k, v in cats.items() if k not in ("parameter", "gradient", "optimizer_state", "offloaded_host")}
    return states > 0 and states > max(rest.values(), default=0)


def predicted_peak(profile: Profile) -> int:
    """Peak with the state on the host between steps: max(peak - state, params + grads + state)."""
    model = model_for(profile)
    return max(measured_peak(profile) - model.optimizer_state_bytes, model.step_peak_bytes)


def propose(profile: Profile, budget: int, evidence: list[dict[str, object]]) -> list[Recommendation]:
    model = model_for(profile)
    state = model.optimizer_state_bytes
    if not state or not model_states_dominate(profile):
        return []
    peak = predicted_peak(profile)
    cost = optimizer_cost(model)
    bandwidth, source = bandwidth_of(profile)
    step = profile.step_time_s
    fits = peak <= budget
    evidence.append({"what": "peak with optimizer state offloaded", "value": peak, "unit": "bytes",
                     "threshold": budget})
    return [Recommendation(
        id="optimizer-offload",
        remedy=SPEC.name,
        title=f"Keep the optimizer state ({gib(state)}) in host memory between steps: peak {gib(peak)}, "
              f"+{fmt_seconds(cost)}/step",
        params={"optimizers": None},
        predicted=Prediction(peak_memory_bytes=peak, step_time_s=None if step is None else step + cost),
        baseline=Prediction(peak_memory_bytes=measured_peak(profile), step_time_s=step),
        cost_model="peak - state, at least params + grads + state during step(); time 2 x state / host link",
        confidence="medium" if source == "measured" else "low",
        exact=True,
        live=True,
        apply_class=SPEC.apply_class,
        prerequisites=["host memory for the optimizer state (pinned on CUDA)"],
        evidence=[f"model states are the largest category at the peak; optimizer state {gib(state)}",
                  f"copies 2 x {gib(state)} per step over a {fmt_rate(bandwidth)} host link ({source}): "
                  f"{fmt_seconds(cost)}",
                  f"during step() the device holds parameters, gradients and state: {gib(model.step_peak_bytes)}"],
        fits=fits,
    )]


def cpu_step_plan(profile: Profile, budget: int) -> Recommendation | None:
    """The ZeRO-Offload style plan (restart): the device keeps parameters and gradients only."""
    model = model_for(profile)
    cats = _categories(profile)
    state, params = model.optimizer_state_bytes, cats.get("parameter", 0)
    if not state:
        return None
    peak = measured_peak(profile) - state
    bandwidth, source = bandwidth_of(profile)
    # gradients down and parameters up in 16 bits: 4 bytes per parameter (about params bytes in fp32)
    link = 4 * (params // 4) / bandwidth if params else 0.0
    host_step = state / CPU_ADAM_BYTES_PER_S
    step = profile.step_time_s
    optimizer_s = profile.phases.get("optimizer_s") or 0.0
    added = link + host_step - optimizer_s
    return Recommendation(
        id="cpu-optimizer-step",
        remedy="cpu_offload",
        title=f"Run the optimizer step on the CPU (ZeRO-Offload style): peak {gib(peak)}, "
              f"{'+' if added >= 0 else ''}{fmt_seconds(added)}/step (restart)",
        params={"plan": "cpu_optimizer_step"},
        predicted=Prediction(peak_memory_bytes=peak, step_time_s=None if step is None else step + added),
        baseline=Prediction(peak_memory_bytes=measured_peak(profile), step_time_s=step),
        cost_model=f"peak - state; time + 4 bytes/param over the host link + state / {CPU_ADAM_BYTES_PER_S / 1e9:g} GB/s "
                   "host Adam - device optimizer step (assumed host speed)",
        confidence="low",
        exact=False,
        live=False,
        apply_class="restart",
        prerequisites=["a host optimizer (e.g. DeepSpeed's CPU Adam) in the script: not applied live"],
        evidence=[f"no live plan fits the {gib(budget)} budget",
                  f"host link {fmt_rate(bandwidth)} ({source}); one published grid measured +32% to +69% "
                  "step time for CPU Adam (REFERENCE.md)"],
        fits=peak <= budget,
    )


SPEC = RemedySpec(
    name="optimizer_offload",
    apply_class="live-exact",
    optional=("optimizers",),
    validate=validate,
    phase="optimizer",
    addresses="memory",
    propose=propose,
)
