"""Optimizer-state offload, the predictor half.

Live offload (``apply/remedies/optimizer_offload.py``): the state lives on the host between
steps and comes back for ``step()``; the peak loses the state bytes; the step itself is
predicted with parameters + gradients + state on the device (conservative: for per-parameter
optimizers the applier steps in chunks, with a few chunks of state up at a time); time: 2 x
state bytes / host-link bandwidth (the chunks overlap the step's own compute, which is not
subtracted). Values are copied bit for bit: ``live-exact``. Proposed when model
states are the largest category at the peak. The restart variant that also moves the step to
the host is ``cpu_offload.py``.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal, gib, peak_categories
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.remedies.offload import bandwidth_of, model_for, optimizer_cost
from advisor.records.advice import Evidence, Prediction, Recommendation
from advisor.records.units import fmt_rate, fmt_seconds


def validate(params: Mapping[str, Any]) -> None:
    """``optimizers``: absent or null (all captured optimizers), or a list of indexes."""
    value = params.get("optimizers")
    if value is None:
        return
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) \
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise ValueError(f"optimizers must be null (all) or a list of indexes >= 0, not {value!r}")


def model_states_dominate(profile: Profile) -> bool:
    """Parameters + gradients + optimizer state are more than any other category at the peak."""
    cats = peak_categories(profile)
    states = sum(cats.get(k, 0) for k in ("parameter", "gradient", "optimizer_state"))
    rest = {k: v for k, v in cats.items() if k not in ("parameter", "gradient", "optimizer_state", "offloaded_host")}
    return states > 0 and states > max(rest.values(), default=0)


def predicted_peak(profile: Profile) -> int:
    """Peak with the state on the host between steps: max(peak - state, params + grads + state)."""
    model = model_for(profile)
    return max(measured_peak(profile) - model.optimizer_state_bytes, model.step_peak_bytes)


def propose(profile: Profile, finding: Finding) -> Proposal:
    model = model_for(profile)
    state = model.optimizer_state_bytes
    budget = finding.budget_bytes
    if not budget or not state or not model_states_dominate(profile):
        return Proposal()
    peak = predicted_peak(profile)
    cost = optimizer_cost(model)
    bandwidth, source = bandwidth_of(profile)
    step = profile.step_time_s
    evidence = Evidence(what="peak with optimizer state offloaded", value=peak, unit="bytes", threshold=budget)
    return Proposal(evidence=(evidence,), recommendations=(Recommendation(
        id="optimizer-offload",
        remedy=SPEC.name,
        title=f"Keep the optimizer state ({gib(state)}) in host memory between steps: peak {gib(peak)}, "
              f"+{fmt_seconds(cost)}/step",
        params={"optimizers": None},
        predicted=Prediction(peak_memory_bytes=peak, step_time_s=None if step is None else step + cost),
        baseline=Prediction(peak_memory_bytes=measured_peak(profile), step_time_s=step),
        budget_bytes=budget,
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
    ),))


SPEC = RemedySpec(
    name="optimizer_offload",
    apply_class="live-exact",
    optional=("optimizers",),
    validate=validate,
    phase="placement",
    addresses=("memory",),
    propose=propose,
)
