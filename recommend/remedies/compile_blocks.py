"""``torch.compile`` of the model's repeated blocks, the predictor half (for ``rules/host_overhead.py``'s
finding).

The applier (``apply/remedies/compile_blocks.py``) calls ``module.compile()`` on each named
block of the unwrapped model, the same step on every rank; revert sets each block's
``_compiled_call_impl`` back to None (PYTORCH-NOTES), which restores the eager forward. Fusion
reorders floating-point work: ``live-equivalent``.

Prediction: compile removes ``GAP_RECOVERED`` of the host gap (an assumption, labelled as such, low
confidence); the executor measures the first compiled steps after the warm-up and keeps or reverts
on what it measured, which calibrates it.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.rules.host_overhead import host_gap, repeated_blocks
from advisor.records.advice import Prediction, Recommendation

GAP_RECOVERED = 0.5  # assumed share of the host gap compile removes (measured by the apply)


def validate(params: Mapping[str, Any]) -> None:
    """``modules``: a non-empty list of qualified module names ("" is the model itself)."""
    value = params.get("modules")
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value \
            or not all(isinstance(n, str) for n in value):
        raise ValueError(f"modules must be a non-empty list of module names, not {value!r}")


def propose(profile: Profile, finding: Finding) -> Proposal:
    gap = host_gap(profile)
    if gap is None:
        return Proposal()
    blocks = repeated_blocks(profile)
    return Proposal(recommendations=(Recommendation(
        id="compile-blocks", remedy=SPEC.name,
        title=f"torch.compile the repeated blocks: {gap.where} ({gap.coverage:.0%} op time)",
        params={"modules": blocks},
        predicted=Prediction(peak_memory_bytes=None, step_time_s=gap.step_s - GAP_RECOVERED * gap.gap_s),
        baseline=Prediction(peak_memory_bytes=None, step_time_s=gap.step_s),
        budget_bytes=profile.budget_bytes,
        cost_model=f"step - {GAP_RECOVERED:g} x host gap (assumed; the apply measures the compiled steps "
                   "after the compile warm-up)",
        confidence="low", exact=False, live=True, apply_class=SPEC.apply_class,
        prerequisites=["a working torch.compile toolchain (a C++ compiler on CPU, Triton on CUDA)",
                       "the first compiled steps are slow while it compiles"],
        evidence=gap.lines() + [f"blocks: {', '.join(b or '(model)' for b in blocks[:4])}"
                                + (f" and {len(blocks) - 4} more" if len(blocks) > 4 else "")],
    ),))


SPEC = RemedySpec(name="compile_blocks", apply_class="live-equivalent", params=("modules",),
                  validate=validate, phase="layout", addresses=("host_overhead",), propose=propose)
