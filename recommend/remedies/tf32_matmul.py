"""TF32 matmuls, the predictor half (for ``rules/compute.py``'s finding).

The applier (``apply/remedies/tf32_matmul.py``) sets ``torch.backends.cuda.matmul.fp32_precision
= "tf32"`` (``allow_tf32`` on torch without it) and puts the previous value back on revert. fp32
matmuls then round their inputs to a 10-bit mantissa: ``live-opt-in``. The tensors stay fp32, so
the peak is predicted unchanged.
"""

from __future__ import annotations

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.rules.compute import lower_precision


def propose(profile: Profile, finding: Finding) -> Proposal:
    return lower_precision(profile, spec_name=SPEC.name, apply_class=SPEC.apply_class, key="tf32", byte_factor=1.0,
                           title="TF32 matmuls", why="inputs rounded to a 10-bit mantissa")


SPEC = RemedySpec(name="tf32_matmul", apply_class="live-opt-in", phase="layout", addresses=("compute",),
                  propose=propose)
