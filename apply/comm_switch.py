"""The delegating DDP communication hook: registered once when DDP is built, switched later.

DDP accepts one ``register_comm_hook`` per object (PYTORCH-NOTES), so a remedy cannot register
its own hook on a running job. The agent (``advisor/agent/capture.py``) registers a
``CommSwitch`` on every DDP object the script builds; by default it runs torch's
``allreduce_hook`` (divide by the group size, all-reduce: what DDP's built-in reducer does).
``grad_compression`` sets ``mode`` to "bf16" or "fp16" (torch's compress hooks) and back. A hook
the script registers itself is kept as ``user`` and delegated to, so the script's own
``register_comm_hook`` call still works.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

MODES = ("default", "bf16", "fp16")
ATTRIBUTE = "_advisor_comm_switch"  # where the switch lives on the DDP object


class CommSwitch:
    """The hook state: which hook runs on each gradient bucket."""

    def __init__(self, process_group: Any) -> None:
        self.process_group = process_group
        self.mode = "default"
        self.user: tuple[Any, Callable[..., Any]] | None = None  # (state, hook) the script registered

    def run(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if self.mode == "bf16":
            return default_hooks.bf16_compress_hook(self.process_group, bucket)
        if self.mode == "fp16":
            return default_hooks.fp16_compress_hook(self.process_group, bucket)
        if self.user is not None:
            state, hook = self.user
            return hook(state, bucket)
        return default_hooks.allreduce_hook(self.process_group, bucket)


def switch_hook(state: CommSwitch, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The function DDP calls per bucket; ``state`` is the ``CommSwitch``."""
    return state.run(bucket)


# DDP checks the hook's annotations as objects; this module's are strings (future annotations).
switch_hook.__annotations__ = {"state": CommSwitch, "bucket": dist.GradBucket,
                               "return": torch.futures.Future[torch.Tensor]}


def install(ddp: Any) -> CommSwitch | None:
    """Register a switch on ``ddp`` (None when it cannot take a hook, e.g. no process group)."""
    group = getattr(ddp, "process_group", None)
    if group is None or getattr(ddp, ATTRIBUTE, None) is not None:
        return None
    switch = CommSwitch(group)
    ddp.register_comm_hook(switch, switch_hook)
    object.__setattr__(ddp, ATTRIBUTE, switch)
    return switch
