"""The delegating DDP communication hook: registered once when DDP is built, switched later.

DDP accepts one ``register_comm_hook`` per object (PYTORCH-NOTES), so a remedy cannot register
its own hook on a running job. The agent (``advisor/agent/capture.py``) registers a
``CommSwitch`` on every DDP object the script builds; by default it does what DDP's built-in
reducer does, bit for bit: multiply each bucket by the reciprocal of the group size, then a sum
all-reduce. (Torch's ``allreduce_hook`` divides instead, which differs in the last bit at a world
size that is not a power of two: checked on 3 gloo ranks, tests/test_apply_grad_compression.py.)
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
        return reducer_allreduce(self.process_group, bucket)


def reducer_allreduce(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's built-in reduction: ``grad * (1 / size)`` (the C++ reducer multiplies by the
    reciprocal as it copies into the bucket), then a sum all-reduce."""
    tensor = bucket.buffer()
    tensor.mul_(1.0 / group.size())
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def builtin_equivalent(kind: Any) -> Callable[..., Any]:
    """The Python hook that computes what torch's built-in hook ``kind`` computes, so a script's
    ``_register_builtin_comm_hook`` can become the switch's delegate."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if kind == dist.BuiltinCommHookType.ALLREDUCE:
        return default_hooks.allreduce_hook  # the C++ hook divides too
    if kind == dist.BuiltinCommHookType.FP16_COMPRESS:
        return default_hooks.fp16_compress_hook
    raise ValueError(f"unknown built-in communication hook {kind!r}")


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
