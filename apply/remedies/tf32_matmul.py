"""TF32 matmuls, the applier half: ``torch.backends.cuda.matmul.fp32_precision = "tf32"``.

On torch without ``fp32_precision`` it sets ``allow_tf32 = True`` instead. ``revert()`` puts the
previous value back. A process-wide backend flag, set on the training thread at a step boundary;
fp32 matmuls then round their inputs to TF32 (``live-opt-in``). The predictor is
``recommend/remedies/tf32_matmul.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from advisor.apply.target import Target

logger = logging.getLogger("advisor.apply")

PHASE = "layout"


def _attribute() -> tuple[Any, str, Any]:
    """(the settings object, the attribute, the value meaning TF32)."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return matmul, "fp32_precision", "tf32"
    return matmul, "allow_tf32", True


@dataclass(eq=False)
class Tf32Handle:
    owner: Any
    attribute: str
    previous: Any
    reverted: bool = False

    def revert(self) -> None:
        if self.reverted:
            return
        setattr(self.owner, self.attribute, self.previous)
        self.reverted = True
        logger.info("Restored torch.backends.cuda.matmul.%s = %r", self.attribute, self.previous)


def apply_tf32_matmul(target: Target | torch.nn.Module) -> Tf32Handle:
    """Switch fp32 matmuls to TF32; ``ValueError`` (nothing changed) when they already are."""
    owner, attribute, value = _attribute()
    previous = getattr(owner, attribute)
    if previous == value:
        raise ValueError(f"torch.backends.cuda.matmul.{attribute} is already {value!r}")
    setattr(owner, attribute, value)
    logger.info("Set torch.backends.cuda.matmul.%s = %r (was %r)", attribute, value, previous)
    return Tf32Handle(owner=owner, attribute=attribute, previous=previous)
