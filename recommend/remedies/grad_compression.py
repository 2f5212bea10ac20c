"""Gradient compression through DDP's communication hook, the predictor half.

The applier (``apply/remedies/grad_compression.py``) switches the delegating hook the agent
registered when the script built its DDP wrapper (``advisor/agent/capture.py``: DDP accepts one
hook per object) to compress each bucket to bf16 or fp16 before the all-reduce. The gradients
lose mantissa bits: ``live-opt-in``.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.remedies import RemedySpec

DTYPES = ("bf16", "fp16")


def validate(params: Mapping[str, Any]) -> None:
    if params.get("dtype", "bf16") not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, not {params.get('dtype')!r}")


SPEC = RemedySpec(name="grad_compression", apply_class="live-opt-in", optional=("dtype",), validate=validate,
                  phase="layout")
