"""Fused optimizer kernels, the predictor half: spec and cost model.

Proposed for the optimizer-step rule's finding (``recommend/rules/optimizer_step.py``: the optimizer
step takes a large share of the step): the foreach kernels launch one kernel per op per tensor list,
the fused ones one per parameter group, so an optimizer-bound step is where they help. The peak is
predicted unchanged (the state is the same tensors' worth). The cost model reads the ops of the optimizer phase
(``Profile.ops``: their count, bytes and kernel time per step): the time between them (dispatch
and launches) goes, and their kernel time falls by ``SPEEDUP``, a plain assumption labelled as
such (without ops: the optimizer step / ``SPEEDUP``), with low confidence: the apply measures the real effect and reverts a
slowdown. The applier is ``apply/remedies/fused_optimizer.py``; it switches the script's own
optimizer object in place (a state-dict round trip), which only reassociates floating-point
sums: ``live-equivalent``.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.records.advice import Prediction, Recommendation
from advisor.records.units import fmt_bytes, fmt_seconds

SPEEDUP = 2.0  # assumed optimizer-step speed-up of fused over foreach kernels (not measured here)


def validate(params: Mapping[str, Any]) -> None:
    """``optimizers``: absent or null (all captured optimizers), or a list of indexes."""
    value = params.get("optimizers")
    if value is None:
        return
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) \
            or not all(isinstance(i, int) and i >= 0 for i in value):
        raise ValueError(f"optimizers must be null (all) or a list of indexes >= 0, not {value!r}")


def propose(profile: Profile, finding: Finding) -> Proposal:
    """Fused kernels for the optimizer step's share of the step (``Profile.phases["optimizer_s"]``)."""
    opt, step = profile.phases.get("optimizer_s"), profile.step_time_s
    if not opt or not step:
        return Proposal()
    share = opt / step
    ops = [o for o in profile.ops if o.phase == "optimizer"]
    steps = max(1, len({o.step for o in ops}))
    count, kernel_s = sum(o.count for o in ops) / steps, sum(o.time_s for o in ops) / steps
    moved = sum(o.bytes for o in ops) / steps
    if ops and kernel_s < opt:
        # From the ops of the optimizer phase: the time between them (per-op dispatch and
        # launches, ``count`` of them) goes, the kernels' own time falls by the assumed factor.
        saved = opt - kernel_s / SPEEDUP
        model = (f"{count:.0f} optimizer ops per step ({fmt_bytes(moved)}, {fmt_seconds(kernel_s)} of kernels): "
                 f"the {fmt_seconds(opt - kernel_s)} between them goes, kernels / {SPEEDUP:g} (assumed)")
        detail = [f"{count:.0f} ops per step move {fmt_bytes(moved)} in {fmt_seconds(kernel_s)}"]
    else:
        saved = opt * (1.0 - 1.0 / SPEEDUP)
        model = f"optimizer step / {SPEEDUP:g} (assumed fused speed-up, verified by the apply)"
        detail = []
    peak = measured_peak(profile) or None  # the same state in other kernels: the peak as measured
    return Proposal(recommendations=(Recommendation(
        id="fused-optimizer",
        remedy=SPEC.name,
        title=f"Fused optimizer kernels: the optimizer step takes {share:.0%} of the step",
        params={"optimizers": None},
        predicted=Prediction(peak_memory_bytes=peak, step_time_s=step - saved),
        baseline=Prediction(peak_memory_bytes=peak, step_time_s=step),
        budget_bytes=profile.budget_bytes,
        cost_model=model,
        confidence="low",
        exact=False,
        live=True,
        apply_class=SPEC.apply_class,
        prerequisites=["an optimizer with a fused implementation (Adam, AdamW, SGD, Adagrad)"],
        evidence=[f"optimizer step {fmt_seconds(opt)} of a {fmt_seconds(step)} step"] + detail,
    ),))


SPEC = RemedySpec(
    name="fused_optimizer",
    apply_class="live-equivalent",
    optional=("optimizers",),
    validate=validate,
    phase="optimizer",
    addresses=("optimizer_step",),
    propose=propose,
)
