"""A dispatch mode that records every aten op of a step with its FLOPs and bytes.

The mode sees ops below autograd, after composite ops (``linear``, ``sdpa``)
have been decomposed into the kernels that actually run, and the same ops in
backward. It costs tens of microseconds of Python per op, which is why
``ComputeProbe`` counts on one step and times on the next (see probe.py).
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from advisor.probes.compute import formulas


class OpCall(NamedTuple):
    """One op call as the counter saw it. A named tuple: one is made per op of a counted step
    (85,000 at 5001 modules), 0.3 us against a frozen dataclass's 1.3 us."""

    name: str  # aten overload packet, e.g. "aten.mm"
    module: str
    phase: str
    input_shapes: tuple[tuple[int, ...], ...]
    dtype: str
    flops: int
    bytes: int
    inline_s: float  # perf_counter time of the call inside the mode (a fallback; inflated on CUDA)


# Ops that exist only to satisfy the dispatcher and never run anything.
_SKIP: frozenset[str] = frozenset({"sym_size", "sym_stride", "sym_numel", "sym_storage_offset"})


class OpCounter(TorchDispatchMode):
    """Records ``OpCall``s; ``where()`` returns (module, phase) for the op in progress."""

    def __init__(self, where: Callable[[], tuple[str, str]]) -> None:
        super().__init__()
        self._where = where
        self.calls: list[OpCall] = []
        # An op's cost depends only on its overload, its tensors' shapes, strides and dtypes, which
        # of them are the same tensor, and its other arguments: a model of 2500 identical layers
        # repeats a handful of signatures 85 000 times, and the formulas were most of the counter's
        # Python per op.
        self._memo: dict[tuple, tuple] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        elapsed = time.perf_counter() - t0
        packet = func.overloadpacket
        if packet.__name__ in _SKIP or func.namespace != "aten":  # e.g. profiler._record_function_*
            return out
        # A DTensor op (FSDP2's optimizer step, a clip over sharded gradients) is seen here with its
        # global shapes; this rank moves and computes its local shards' bytes and FLOPs. The pytree
        # walk (a third of the mode's cost per op, 6.7 s over the 85 000 ops of a 5001-module
        # model's deep step) only where a tensor subclass is among them, which the key's own walk
        # finds (a separate walk for subclasses cost 0.2 s of that step).
        local_args, local_kwargs, local_out = args, kwargs, out
        try:
            key: tuple | None = _key(func, args, kwargs, out)
        except _Subclass:
            local_args, local_kwargs, local_out = tree_map(_shard, (args, kwargs, out))
            key = _local_key(func, local_args, local_kwargs, local_out)
        except _Unkeyable:  # an argument of a kind not described: a subclass may still follow it
            key = None
            if _has_subclass(args) or _has_subclass(tuple(kwargs.values())) or _has_subclass(out):
                local_args, local_kwargs, local_out = tree_map(_shard, (args, kwargs, out))
        known = self._memo.get(key) if key is not None else None
        if known is None:
            inputs = formulas.tensor_args(local_args, local_kwargs)
            cost = formulas.op_cost(func, local_args, local_kwargs, local_out, inputs)
            known = (str(packet), tuple(tuple(s) for s in formulas.input_shapes(local_args, local_kwargs, inputs)),
                     formulas.op_dtype(local_args, local_kwargs, local_out, inputs), cost.flops, cost.bytes)
            if key is not None:
                if len(self._memo) >= MEMO_ENTRIES:
                    self._memo.clear()
                self._memo[key] = known
        name, shapes, dtype, flops, nbytes = known
        module, phase = self._where()
        self.calls.append(OpCall(name, module, phase, shapes, dtype, flops, nbytes, elapsed))
        return out


_PLAIN = (torch.Tensor, torch.nn.Parameter)
MEMO_ENTRIES = 50_000
_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def _key(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple:
    """What an op's cost depends on, hashable. Raises ``_Subclass`` at a tensor of a subclass (a
    DTensor: its local shards are what this rank pays for) and ``_Unkeyable`` at an argument of a
    kind not described."""
    ids: dict[int, int] = {}
    frozen_kwargs = tuple(sorted((k, _frozen(v, ids)) for k, v in kwargs.items())) if kwargs else ()
    return (func, _frozen(args, ids), frozen_kwargs, _frozen(out, ids))


def _local_key(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple | None:
    """``_key`` of an op's local shards; None when they cannot be keyed."""
    try:
        return _key(func, args, kwargs, out)
    except _Unkeyable:
        return None


class _Unkeyable(Exception):
    pass


class _Subclass(_Unkeyable):
    pass


_SEQUENCES = (list, tuple, torch.Size)
_SCALAR_TYPES = frozenset(_SCALARS)  # for the exact-type test first


def _frozen(value: Any, ids: dict[int, int]) -> Any:
    kind = type(value)  # exact types first: this runs for every argument of every op of a counted step
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        return ("T", value.shape, value.stride(), value.dtype, ids.setdefault(id(value), len(ids)))
    if kind in _SEQUENCES:
        return tuple([_frozen(v, ids) for v in value])
    if kind in _SCALAR_TYPES:
        return value
    if isinstance(value, torch.Tensor):
        raise _Subclass
    if isinstance(value, (list, tuple)):
        return tuple([_frozen(v, ids) for v in value])
    if isinstance(value, _SCALARS):
        return value
    raise _Unkeyable


def _has_subclass(value: Any) -> bool:
    """Whether ``value`` (an op's arguments: tensors, lists and tuples of them, scalars) holds a
    tensor of a subclass (a DTensor), without pytree's walk."""
    if isinstance(value, torch.Tensor):
        return type(value) not in _PLAIN
    if isinstance(value, (list, tuple)):
        return any(_has_subclass(v) for v in value)
    return False


def _shard(value: Any) -> Any:
    """A DTensor's local tensor (the same object each time, so an in-place op's output is still its
    input), anything else as it is."""
    local = getattr(value, "_local_tensor", None) if isinstance(value, torch.Tensor) else None
    return local if isinstance(local, torch.Tensor) else value


def count_ops(fn: Callable[[], Any], *, phase: str = "forward") -> list[OpCall]:
    """Run ``fn`` under a counter (no module attribution); for tests and benches."""
    counter = OpCounter(lambda: ("", phase))
    with counter:
        fn()
    return counter.calls
