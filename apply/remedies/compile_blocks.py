"""``torch.compile`` of named blocks, the applier half.

``module.compile()`` on each block of the unwrapped model (the same modules on every rank, the
names come from the recommendation); the parent keeps calling the same module objects, so the
wrappers and the optimizer see no change. ``revert()`` sets each block's
``_compiled_call_impl`` back to what it was (None: the eager forward; PYTORCH-NOTES). The first
calls compile (slow); the executor's warm-up step absorbs the first, and it measures what
follows. Fusion reorders floating-point work: ``live-equivalent``. The predictor is
``recommend/remedies/compile_blocks.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from advisor.apply.compiled import compiled_model
from advisor.apply.target import Target, as_target, unwrap_model

logger = logging.getLogger("advisor.apply")

PHASE = "layout"


@dataclass(eq=False)
class CompileHandle:
    compiled: list[tuple[nn.Module, Any]] = field(default_factory=list)  # (block, previous impl)
    reverted: bool = False

    def revert(self) -> None:
        if self.reverted:
            return
        for block, previous in reversed(self.compiled):
            block._compiled_call_impl = previous
        self.reverted = True
        logger.info("Restored the eager forward of %d block(s)", len(self.compiled))


def apply_compile_blocks(target: Target | nn.Module, *, modules: Sequence[str]) -> CompileHandle:
    """Compile each named block ("" is the whole model); ``ValueError`` naming an unknown one."""
    names = list(modules)
    table = dict(_unwrapped(target, names).named_modules())
    missing = [n for n in names if n not in table]
    if missing:
        raise ValueError(f"no module named {missing} in the model")
    handle = CompileHandle()
    for name in names:
        block = table[name]
        if getattr(block, "_compiled_call_impl", None) is not None:
            continue  # already compiled (by the script or an earlier apply)
        previous = block._compiled_call_impl
        block.compile()
        handle.compiled.append((block, previous))
    if not handle.compiled:
        raise ValueError("every named block is compiled already")
    logger.info("Compiled %d block(s) with torch.compile: %s", len(handle.compiled),
                ", ".join(n or "(model)" for n in names[:4]) + (" ..." if len(names) > 4 else ""))
    return handle


def _unwrapped(target: Target | nn.Module, names: list[str]) -> nn.Module:
    return unwrap_model(as_target(target).model_for([n for n in names if n]))


def compiler_available() -> bool:
    """Whether ``torch.compile`` can run here (Dynamo is supported on this Python)."""
    try:
        return bool(torch._dynamo.is_dynamo_supported())
    except Exception:  # pragma: no cover
        return False


def check_compile_blocks(target: Target) -> dict[str, str]:
    """Refused when the script compiles its model already: compiling its blocks again adds nothing."""
    if compiled_model(target.wrapped_models):
        return {"": "the model is compiled already (torch.compile in the script)"}
    return {}
