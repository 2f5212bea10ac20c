"""The CPU optimizer step (ZeRO-Offload style), the predictor half of a restart remedy.

State and step on the host, gradients down and parameters up (about 4 x parameter count bytes in
16 bits per step, REFERENCE.md), so the device holds parameters, gradients and activations only:
peak - optimizer state. It needs a host optimizer in the script (DeepSpeed's CPU Adam, say), so
it is a ``restart`` remedy with no applier, and a fallback: the memory rule asks it only when no
live remedy fits the budget (and not when activations dominate and checkpointing found nothing
to change: the job fits as it is).
"""

from __future__ import annotations

from advisor.recommend.finding import Finding, Proposal, gib, largest_category, peak_categories
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.remedies.offload import bandwidth_of, model_for
from advisor.records.advice import Prediction, Recommendation
from advisor.records.units import fmt_rate, fmt_seconds

CPU_ADAM_BYTES_PER_S = 2e9  # state bytes a host Adam step updates per second (assumed, several cores)
CHANGE = "a host optimizer (e.g. DeepSpeed's CPU Adam) in the script: not applied live"


def propose(profile: Profile, finding: Finding) -> Proposal:
    """The plan, when the job has optimizer state to move and nothing else fits."""
    budget = finding.budget_bytes
    if not budget or (largest_category(profile) == "activation" and finding.lowest_peak_bytes is None):
        return Proposal()
    model = model_for(profile)
    state, params = model.optimizer_state_bytes, peak_categories(profile).get("parameter", 0)
    if not state:
        return Proposal()
    peak = measured_peak(profile) - state
    bandwidth, source = bandwidth_of(profile)
    # gradients down and parameters up in 16 bits: 4 bytes per parameter (about params bytes in fp32)
    link = 4 * (params // 4) / bandwidth if params else 0.0
    host_step = state / CPU_ADAM_BYTES_PER_S
    step = profile.step_time_s
    optimizer_s = profile.phases.get("optimizer_s") or 0.0
    added = link + host_step - optimizer_s
    return Proposal(recommendations=(Recommendation(
        id="cpu-optimizer-step",
        remedy=SPEC.name,
        title=f"Run the optimizer step on the CPU (ZeRO-Offload style): peak {gib(peak)}, "
              f"{'+' if added >= 0 else ''}{fmt_seconds(added)}/step (restart)",
        params={"plan": "cpu_optimizer_step"},
        predicted=Prediction(peak_memory_bytes=peak, step_time_s=None if step is None else step + added),
        baseline=Prediction(peak_memory_bytes=measured_peak(profile), step_time_s=step),
        budget_bytes=budget,
        cost_model=f"peak - state; time + 4 bytes/param over the host link + state / {CPU_ADAM_BYTES_PER_S / 1e9:g} GB/s "
                   "host Adam - device optimizer step (assumed host speed)",
        confidence="low",
        exact=False,
        live=False,
        apply_class=SPEC.apply_class,
        prerequisites=[CHANGE],
        evidence=[f"no live plan fits the {gib(budget)} budget",
                  f"host link {fmt_rate(bandwidth)} ({source}); one published grid measured +32% to +69% "
                  "step time for CPU Adam (REFERENCE.md)"],
    ),))


SPEC = RemedySpec(
    name="cpu_offload",
    apply_class="restart",
    optional=("plan",),
    phase="optimizer",
    addresses=("memory",),
    propose=propose,
    fallback=True,
    restart_change=CHANGE,
)
