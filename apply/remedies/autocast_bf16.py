"""bf16 autocast around the model's forward, the applier half.

The unwrapped model's ``forward`` is replaced, on the instance, by one that runs the original
inside ``torch.autocast(device_type, dtype=torch.bfloat16)``; the wrappers (DDP, FSDP) call it
as before. Outputs come back in bf16 where autocast made them so (the loss follows); gradients
and parameters stay fp32. ``revert()`` restores the instance's previous ``forward`` (or removes
the instance attribute when there was none). Numerics change: ``live-opt-in``. The predictor is
``recommend/remedies/autocast_bf16.py``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from advisor.apply.target import Target, as_target

logger = logging.getLogger("advisor.apply")

PHASE = "layout"
_MARK = "_advisor_autocast"  # set on the replacement forward, so a second apply is refused


@dataclass(eq=False)
class AutocastHandle:
    model: nn.Module
    had_own: bool  # the instance had its own ``forward`` attribute before
    previous: Any
    reverted: bool = False

    def revert(self) -> None:
        if self.reverted:
            return
        if self.had_own:
            self.model.forward = self.previous
        else:
            del self.model.forward
        self.reverted = True
        logger.info("Removed bf16 autocast from %s.forward", type(self.model).__name__)


def apply_autocast_bf16(target: Target | nn.Module, *, model: int = 0) -> AutocastHandle:
    """Run model ``model``'s forward under bf16 autocast on the target's device type."""
    found = as_target(target)
    models = found.models
    if not 0 <= model < len(models):
        raise ValueError(f"model must be an index in 0..{len(models) - 1}, got {model!r}")
    module = models[model]
    if getattr(module.forward, _MARK, False):
        raise ValueError(f"{type(module).__name__}.forward already runs under bf16 autocast")
    device_type = found.device.type
    had_own = "forward" in module.__dict__
    previous = module.__dict__.get("forward")
    inner = module.forward  # bound: the class's forward, or the instance's own

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            return inner(*args, **kwargs)

    setattr(forward, _MARK, True)
    module.forward = forward
    logger.info("Wrapped %s.forward in torch.autocast(%r, bfloat16)", type(module).__name__, device_type)
    return AutocastHandle(model=module, had_own=had_own, previous=previous)
