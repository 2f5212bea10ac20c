"""bf16 autocast around the model's forward, the predictor half (for ``rules/compute.py``'s finding).

The applier (``apply/remedies/autocast_bf16.py``) wraps the unwrapped model's ``forward`` in
``torch.autocast(device_type, dtype=torch.bfloat16)``; matmuls and convolutions then run in
bf16 on the tensor cores. It changes numerics: ``live-opt-in``.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.rules.compute import lower_precision


def validate(params: Mapping[str, Any]) -> None:
    """``model``: absent (the first captured model) or an index >= 0."""
    value = params.get("model", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"model must be an index >= 0, not {value!r}")


def propose(profile: Profile, finding: Finding) -> Proposal:
    """Matmuls in bf16: half the bytes at the bf16 peak (the peak is not predicted: autocast keeps
    the fp32 weights and adds bf16 copies while the activations shrink)."""
    return lower_precision(profile, spec_name=SPEC.name, apply_class=SPEC.apply_class, key="bf16", byte_factor=0.5,
                           title="bf16 autocast around the forward", why="matmuls in bf16 (8-bit mantissa)")


SPEC = RemedySpec(
    name="autocast_bf16",
    apply_class="live-opt-in",
    optional=("model",),
    validate=validate,
    phase="layout",  # wraps the forward: after anything that edits the module tree
    addresses=("compute",),
    propose=propose,
)
