"""Gradient accumulation under ``no_sync``, the predictor half (``rules/communication.py``).

``restart``: it changes the training loop (k micro-batches per optimizer step, the gradient
all-reduce only on the last) and the effective batch; the recommendation carries the change.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.remedies import RemedySpec


def validate(params: Mapping[str, Any]) -> None:
    value = params.get("micro_batches")
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise ValueError(f"micro_batches must be an integer >= 2, not {value!r}")


SPEC = RemedySpec(name="grad_accumulation", apply_class="restart", params=("micro_batches",),
                  validate=validate, phase="layout")


def change(k: int) -> str:
    return (f"accumulate {k} micro-batches per optimizer step: run the first {k - 1} backward passes "
            f"inside `with model.no_sync():`, the last outside it, then optimizer.step(); divide each "
            f"loss by {k} (or the learning rate schedule sees a {k}x larger batch)")
