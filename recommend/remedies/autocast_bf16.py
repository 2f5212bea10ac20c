"""bf16 autocast around the model's forward, the predictor half (proposed by ``rules/compute.py``).

The applier (``apply/remedies/autocast_bf16.py``) wraps the unwrapped model's ``forward`` in
``torch.autocast(device_type, dtype=torch.bfloat16)``; matmuls and convolutions then run in
bf16 on the tensor cores. It changes numerics: ``live-opt-in``.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.remedies import RemedySpec


def validate(params: Mapping[str, Any]) -> None:
    """``model``: absent (the first captured model) or an index >= 0."""
    value = params.get("model", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"model must be an index >= 0, not {value!r}")


SPEC = RemedySpec(
    name="autocast_bf16",
    apply_class="live-opt-in",
    optional=("model",),
    validate=validate,
    phase="layout",  # wraps the forward: after anything that edits the module tree
)
