"""Expandable allocator segments, the applier half: a check, not a change.

The setting is the plan's environment (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``),
read by the CUDA caching allocator at start-up; applying this remedy from a plan confirms the
training process got it, and raises (the plan reports the failure) when it did not. ``revert()``
has nothing to undo. The predictor is ``recommend/remedies/expandable_segments.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from advisor.apply.target import Target

PHASE = "saved-tensors"
VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"


@dataclass(eq=False)
class NothingToRevert:
    def revert(self) -> None:
        return None


def apply_expandable_segments(target: Target | torch.nn.Module) -> NothingToRevert:
    settings = os.environ.get(VARIABLE, "").replace(" ", "")
    if "expandable_segments:True" not in settings.split(","):
        raise ValueError(f"{VARIABLE} lacks expandable_segments:True (is {settings!r}); it must be set "
                         "before the process starts: run the plan with `advisor attach --plan`")
    return NothingToRevert()
