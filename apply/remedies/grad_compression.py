"""Gradient compression, the applier half: switch the DDP wrappers' delegating hooks to bf16/fp16.

The hook was registered when the script built each DDP object (``advisor.apply.comm_switch``);
this sets its ``mode`` (torch's ``bf16_compress_hook`` / ``fp16_compress_hook``: each bucket is
cast, all-reduced and cast back) and ``revert()`` sets the previous mode back. Gradients lose
mantissa bits: ``live-opt-in``. The predictor is ``recommend/remedies/grad_compression.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from advisor.apply import comm_switch
from advisor.apply.target import Target

logger = logging.getLogger("advisor.apply")

PHASE = "layout"


@dataclass(eq=False)
class CompressionHandle:
    switched: list[tuple[Any, str]] = field(default_factory=list)  # (switch, previous mode)
    reverted: bool = False

    def revert(self) -> None:
        if self.reverted:
            return
        for switch, previous in reversed(self.switched):
            switch.mode = previous
        self.reverted = True
        logger.info("Gradient all-reduce back to full precision on %d DDP wrapper(s)", len(self.switched))


def apply_grad_compression(target: Target, *, dtype: str = "bf16") -> CompressionHandle:
    if dtype not in comm_switch.MODES[1:]:
        raise ValueError(f"dtype must be one of {list(comm_switch.MODES[1:])}, not {dtype!r}")
    ddps = [w for w in target.wrappers if type(w).__name__ == "DistributedDataParallel"]
    if not ddps:
        raise ValueError("no DistributedDataParallel wrapper captured")
    switches = [getattr(w, comm_switch.ATTRIBUTE, None) for w in ddps]
    if any(s is None for s in switches):
        raise ValueError("a DDP wrapper has no delegating hook: it was built before the advisor's hooks, "
                         "or the agent's settings say comm_switch=False")
    if all(s.mode == dtype for s in switches):
        raise ValueError(f"gradients are already compressed to {dtype}")
    handle = CompressionHandle()
    for switch in switches:
        handle.switched.append((switch, switch.mode))
        switch.mode = dtype
    logger.info("Gradient all-reduce compressed to %s on %d DDP wrapper(s)", dtype, len(switches))
    return handle
