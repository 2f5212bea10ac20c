"""``torch.compile`` of the model's repeated blocks, the predictor half (``rules/host_overhead.py``).

The applier (``apply/remedies/compile_blocks.py``) calls ``module.compile()`` on each named
block of the unwrapped model, the same step on every rank; revert sets each block's
``_compiled_call_impl`` back to None (PYTORCH-NOTES), which restores the eager forward. Fusion
reorders floating-point work: ``live-equivalent``.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.remedies import RemedySpec


def validate(params: Mapping[str, Any]) -> None:
    """``modules``: a non-empty list of qualified module names ("" is the model itself)."""
    value = params.get("modules")
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value \
            or not all(isinstance(n, str) for n in value):
        raise ValueError(f"modules must be a non-empty list of module names, not {value!r}")


SPEC = RemedySpec(name="compile_blocks", apply_class="live-equivalent", params=("modules",),
                  validate=validate, phase="layout")
