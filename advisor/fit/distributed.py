"""A world of N ranks in one process: PyTorch's fake process group, and DDP made to run on it.

``init_process_group`` (whatever backend, store or ``device_id`` the script names) makes a group of
PyTorch's ``fake`` backend (``torch.testing._internal.distributed.fake_pg``): every collective
returns at once, leaving its tensors as they were, which is all fake tensors need. The fitting
process is rank 0; its environment says so as torchrun's would (``FitSettings.environment``).

DDP does not run on it as it is (PYTORCH-NOTES): it checks the parameters' shapes across ranks
with real values, its reducer re-buckets after the first step by broadcasting real bucket
indices, and its all-reduce's future carries no tensor on the fake backend. So during a fit the
shape check is skipped, the reducer keeps its first bucket assignment (the same buckets of the
same total size, in parameter order rather than in the order gradients came), and an asynchronous
``all_reduce`` returns a work whose future carries its tensor. DDP's gradient buckets are then
allocated as DDP allocates them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from advisor.fit.patches import Patches
from advisor.records.fit import FitSettings


class _Done:
    """A finished collective whose future carries its tensors (the fake backend's carries none)."""

    def __init__(self, work: Any, tensors: list[torch.Tensor]) -> None:
        self._work = work
        self._tensors = tensors

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._tensors)
        return future

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class _NoRebuild:
    """DDP's reducer, less its re-bucketing after the first step (real bucket indices, broadcast)."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def _all_reduce_hook(group: Any, bucket: Any) -> torch.futures.Future:
    tensor = bucket.buffer()
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])


# DDP checks a hook's annotations as objects; this module's are strings (future annotations).
_all_reduce_hook.__annotations__ = {"group": Any, "bucket": dist.GradBucket,
                                    "return": torch.futures.Future[torch.Tensor]}


def _real_device_meshes(patches: Patches) -> None:
    """A ``DeviceMesh`` reads its rank map (``tolist``, ``nonzero``): it is built of real tensors,
    outside the fake mode. A rank map made under it (``init_device_mesh``'s ``arange``, or the
    script's own) has no values; it is taken to be the identity map of its shape, which is what
    both make."""
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh.__init__

    def real(value: Any) -> Any:
        if isinstance(value, FakeTensor):
            with unset_fake_temporarily():
                return torch.arange(value.numel(), dtype=value.dtype).view(tuple(value.shape))
        return value

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        args = tuple(real(a) for a in args)
        kwargs = {k: real(v) for k, v in kwargs.items()}
        with unset_fake_temporarily(), torch._C.DisableTorchFunction():
            original(self, *args, **kwargs)

    patches.set(DeviceMesh, "__init__", __init__)


def install_world(patches: Patches, settings: FitSettings) -> None:
    """Route the script's process group, DDP and all-reduce to the fake world (restored by ``patches``)."""
    import torch.distributed.distributed_c10d as c10d
    import torch.nn.parallel.distributed as ddp_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    original_init = c10d.init_process_group

    def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None,
                           world_size: int = -1, rank: int = -1, store: Any = None, group_name: str = "",
                           pg_options: Any = None, device_id: Any = None) -> None:
        kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        original_init("fake", store=FakeStore(), rank=0, world_size=settings.world_size, **kwargs)

    patches.set(c10d, "init_process_group", init_process_group)
    patches.set(dist, "init_process_group", init_process_group)
    patches.set(ddp_module, "_verify_param_shape_across_processes", lambda *args, **kwargs: None)

    original_all_reduce = c10d.all_reduce

    def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Any:
        work = original_all_reduce(tensor, op=op, group=group, async_op=async_op)
        return _Done(work, [tensor]) if async_op else work

    patches.set(c10d, "all_reduce", all_reduce)
    patches.set(dist, "all_reduce", all_reduce)

    _real_device_meshes(patches)
    cls = torch.nn.parallel.DistributedDataParallel
    built = cls.__init__  # the agent's capturing wrapper, when it is installed

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        built(self, *args, **kwargs)
        reducer = getattr(self, "reducer", None)
        if reducer is None:
            return
        self.reducer = _NoRebuild(reducer)
        if getattr(self, "_advisor_comm_switch", None) is None:
            # DDP's C++ all-reduce reads its work's future, empty on the fake backend; the agent's
            # delegating hook (advisor.apply.comm_switch) goes through ``all_reduce`` above instead.
            self.register_comm_hook(self.process_group, _all_reduce_hook)

    patches.set(cls, "__init__", __init__)
