"""Fused optimizer kernels, the predictor half: spec, cost model and the rule that proposes them.

The rule fires when the optimizer step takes a large share of the step: the foreach kernels
launch one kernel per op per tensor list, the fused ones one per parameter group, so an
optimizer-bound step is where they help. The cost model is a plain assumption (``SPEEDUP``),
labelled as such, with low confidence: the apply measures the real effect and reverts a
slowdown. The applier is ``apply/remedies/fused_optimizer.py``; it switches the script's own
optimizer object in place (a state-dict round trip), which only reassociates floating-point
sums: ``live-equivalent``.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.records.advice import Prediction, Recommendation

OPTIMIZER_SHARE = 0.25  # optimizer step above this share of the step time deserves advice
SPEEDUP = 2.0  # assumed optimizer-step speed-up of fused over foreach kernels (not measured here)


def validate(params: Mapping[str, Any]) -> None:
    """``optimizers``: absent or null (all captured optimizers), or a list of indexes."""
    value = params.get("optimizers")
    if value is None:
        return
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) \
            or not all(isinstance(i, int) and i >= 0 for i in value):
        raise ValueError(f"optimizers must be null (all) or a list of indexes >= 0, not {value!r}")


def fused_rule(profile: Profile) -> Finding | None:
    """Optimizer step above ``OPTIMIZER_SHARE`` of the step: propose fused kernels."""
    opt, step = profile.phases.get("optimizer_s"), profile.step_time_s
    if not opt or not step or opt <= OPTIMIZER_SHARE * step:
        return None
    share = opt / step
    saved = opt * (1.0 - 1.0 / SPEEDUP)
    rec = Recommendation(
        id="fused-optimizer",
        remedy=SPEC.name,
        title=f"Fused optimizer kernels: the optimizer step takes {share:.0%} of the step",
        params={"optimizers": None},
        predicted=Prediction(peak_memory_bytes=None, step_time_s=step - saved),
        baseline=Prediction(peak_memory_bytes=None, step_time_s=step),
        cost_model=f"optimizer step / {SPEEDUP:g} (assumed fused speed-up, verified by the apply)",
        confidence="low",
        exact=False,
        live=True,
        apply_class=SPEC.apply_class,
        prerequisites=["an optimizer with a fused implementation (Adam, AdamW, SGD, Adagrad)"],
        evidence=[f"optimizer step {opt * 1e3:.1f} ms of a {step * 1e3:.1f} ms step"],
        fits=True,
    )
    return Finding(bottleneck="launch_overhead", summary=f"the optimizer step takes {share:.0%} of the step",
                   severity=share / 2,  # below memory (>= 1) and an input stall of the same share
                   evidence=[{"what": "optimizer step / step time", "value": round(share, 4),
                              "threshold": OPTIMIZER_SHARE}],
                   recommendations=[rec])


SPEC = RemedySpec(
    name="fused_optimizer",
    apply_class="live-equivalent",
    optional=("optimizers",),
    validate=validate,
    phase="optimizer",
)
RULE = fused_rule
