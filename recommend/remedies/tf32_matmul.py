"""TF32 matmuls, the predictor half (proposed by ``rules/compute.py``).

The applier (``apply/remedies/tf32_matmul.py``) sets ``torch.backends.cuda.matmul.fp32_precision
= "tf32"`` (``allow_tf32`` on torch without it) and puts the previous value back on revert. fp32
matmuls then round their inputs to a 10-bit mantissa: ``live-opt-in``.
"""

from __future__ import annotations

from advisor.recommend.remedies import RemedySpec

SPEC = RemedySpec(name="tf32_matmul", apply_class="live-opt-in", phase="layout")
