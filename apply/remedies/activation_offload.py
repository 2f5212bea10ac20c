"""Activation offload of named submodules, the applier half (the predictor is
``recommend/remedies/activation_offload.py``; the joint solver ``recommend/remedies/offload.py``).

How: like the checkpointing applier, each named module gets an *instance* ``forward`` that runs
the previous forward inside ``torch.autograd.graph.saved_tensors_hooks(pack, unpack)``. ``pack``
copies each tensor autograd saves into a reused host slab (``_host_copies.HostSlab``, pinned on
CUDA) and drops the device tensor; ``unpack`` copies it back. The module tree, parameters and
state-dict keys are untouched and values are copied bit for bit: ``live-exact``.

What stays on the device: parameters (saved weights; copying them would move every weight twice
a step for nothing, the weight stays alive anyway), tensors below ``min_bytes``, small views of
a storage more than ``SPAN`` times their size (the whole storage would cross), and, by refusal, the last block of a numbered
run (``blocks.N``): its backward starts as soon as forward ends, so its copy could never hide.

On CUDA the device-to-host copy runs on a side stream after the captured compute stream, the
device tensor is kept alive for that stream (``record_stream``) and an event marks the copy's end;
the first unpack of one module's call also queues, on the side stream, the host-to-device copies
of the call before it when that is the block just before (the next one backward needs), and
compute waits on an event only when a tensor is used. On a CPU-only build the "device" is the
host: the copies are synchronous same-device copies through the same code.

Interplay: the memory tracker's own saved-tensor hooks are outer, ours inner, so offloaded tensors
are not counted as activations; the slab is ``offloaded_host`` (``advisor.records.host_memory``).
"""

from __future__ import annotations

import functools
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from advisor.apply.forward_patch import ForwardPatches, is_patched
from advisor.apply.remedies._host_copies import HostSlab, Streams, no_accelerator
from advisor.apply.remedies.activation_checkpointing import (
    apply_activation_checkpointing, is_checkpointed, resolve_modules,
)
from advisor.apply.target import Target, as_target, unwrap_model

logger = logging.getLogger("advisor.apply")

PHASE = "saved-tensors"  # advisor.records.remedy.PHASES
SPAN = 4  # a view is offloaded with its whole storage when that storage is at most this many times the view
MIN_BYTES = 1 << 20  # smaller saved tensors stay on the device: their copies cost more in launches than they free
_MARK = "__advisor_offload__"


def is_offloaded(module: nn.Module) -> bool:
    """True when ``apply_activation_offload`` currently wraps ``module``."""
    return is_patched(module, _MARK)


class _Storage:
    """One offloaded storage: its bytes in the slab and, once fetched, on the device again.

    Views saved by the same call (q, k and v split from one projection) share it, so each
    storage crosses the link once and comes back as one allocation, as it was.
    """

    __slots__ = ("host", "nbytes", "device", "event", "__weakref__")

    def __init__(self, host: torch.Tensor, nbytes: int, event: Any) -> None:
        self.host = host
        self.nbytes = nbytes
        self.device: torch.Tensor | None = None  # uint8 on the device
        self.event = event


class _Saved:
    """One offloaded tensor: its storage and the view metadata to rebuild it bit for bit."""

    __slots__ = ("storage", "offset", "shape", "stride", "dtype", "group", "__weakref__")

    def __init__(self, storage: _Storage, t: torch.Tensor, group: "_Group") -> None:
        self.storage = storage
        self.offset, self.shape, self.stride, self.dtype = t.storage_offset(), t.shape, t.stride(), t.dtype
        self.group = group


class _Group:
    """The storages one call of one module offloaded, and the call before it (prefetched next)."""

    __slots__ = ("storages", "open", "previous", "fetched", "name")

    def __init__(self, previous: "_Group | None", name: str = "") -> None:
        self.name = name
        self.storages: list[weakref.ref[_Storage]] = []
        # While the call's forward runs: source storage key -> (the source, its copy). Holding the
        # source keeps its key from being reused by a new allocation before the call ends.
        self.open: dict[int, tuple[Any, _Storage]] = {}
        self.previous = previous
        self.fetched = False


@dataclass(eq=False)
class OffloadHandle:
    """What ``apply_activation_offload`` changed; ``revert()`` undoes it exactly."""

    modules: tuple[str, ...]
    min_bytes: int
    device: torch.device
    _patches: ForwardPatches = field(default_factory=lambda: ForwardPatches(_MARK, "activation offload"), repr=False)
    slab: HostSlab | None = None
    streams: Streams | None = None
    live: int = 0  # offloaded tensors autograd still holds
    offloaded_bytes: int = 0  # bytes moved to the host since apply (device tensors freed)
    kept_bytes: int = 0  # bytes our hooks saw and left on the device
    reverted: bool = False
    _param_keys: set[int] = field(default_factory=set, repr=False)
    _last: _Group | None = field(default=None, repr=False)
    checkpoint: Any = None  # the CheckpointHandle of a mixed plan's recomputed modules

    # -- hooks ----------------------------------------------------------------------------
    def _pack(self, group: _Group, t: torch.Tensor) -> Any:
        nbytes = t.numel() * t.element_size()
        source = t.untyped_storage()
        key = source._cdata
        if (nbytes < self.min_bytes or isinstance(t, nn.Parameter) or (t.is_leaf and t.requires_grad)
                or key in self._param_keys or t.device != self.device
                or source.nbytes() > SPAN * nbytes and key not in group.open):
            self.kept_bytes += nbytes  # small, a weight, or a small view of a large storage
            return t
        assert self.slab is not None and self.streams is not None
        storage = group.open[key][1] if key in group.open else None
        if storage is None:
            whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(source)
            host = self.slab.take(source.nbytes())
            self.streams.side_waits_compute()
            with self.streams.on_side():
                host.copy_(whole, non_blocking=self.streams.side is not None)
            if self.streams.side is not None:
                whole.record_stream(self.streams.side)  # the allocator must not reuse it before the copy ends
            storage = _Storage(host, source.nbytes(), self.streams.record())
            group.open[key] = (source, storage)
            group.storages.append(weakref.ref(storage))
            self.live += 1
            self.offloaded_bytes += source.nbytes()
            weakref.finalize(storage, self._released)
        return _Saved(storage, t, group)

    def _unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Saved):
            return packed
        assert self.streams is not None
        group = packed.group
        if not group.fetched:  # first use of this call: fetch it, and prefetch the block just before it
            self._fetch(group)
            if group.previous is not None and _adjacent(group.previous.name, group.name):
                self._fetch(group.previous)
        storage = packed.storage
        if storage.device is None:  # released from the group's table before the fetch: fetch alone
            self._fetch_one(storage)
        self.streams.compute_waits(storage.event)
        buf = storage.device
        assert buf is not None
        if self.streams.side is not None:
            buf.record_stream(self.streams.compute or torch.cuda.current_stream(self.device))
        return torch.empty(0, dtype=packed.dtype, device=buf.device).set_(
            buf.untyped_storage(), packed.offset, packed.shape, packed.stride)

    def _fetch_one(self, storage: _Storage) -> None:
        assert self.streams is not None
        with self.streams.on_side():
            storage.device = torch.empty(storage.nbytes, dtype=torch.uint8, device=self.device)
            storage.device.copy_(storage.host, non_blocking=self.streams.side is not None)

    def _fetch(self, group: _Group) -> None:
        if group.fetched:
            return
        group.fetched = True
        assert self.streams is not None
        self.streams.side_waits_compute()
        alive = [s for s in (ref() for ref in group.storages) if s is not None and s.device is None]
        for storage in alive:
            self._fetch_one(storage)
        event = self.streams.record()
        for storage in alive:
            storage.event = event

    def _released(self) -> None:
        self.live -= 1
        if self.live == 0 and self.slab is not None:
            if self.reverted:
                self.slab.free()
            else:
                self.slab.reset()
            self._last = None

    def wrap(self, inner: Callable[..., Any], name: str = "") -> Callable[..., Any]:
        @functools.wraps(inner)
        def forward(*args: Any, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return inner(*args, **kwargs)
            assert self.streams is not None
            self.streams.capture()
            group = _Group(self._last, name)
            self._last = group
            try:
                with torch.autograd.graph.saved_tensors_hooks(functools.partial(self._pack, group), self._unpack):
                    return inner(*args, **kwargs)
            finally:
                group.open.clear()  # the sources may be freed now

        return forward

    # -- revert ---------------------------------------------------------------------------
    def revert(self) -> None:
        """Restore each module's forward; tensors already offloaded still come back in backward."""
        if self.reverted:
            return
        self._patches.restore()
        self.reverted = True
        if self.checkpoint is not None:
            self.checkpoint.revert()
        if self.live == 0 and self.slab is not None:
            self.slab.free()
        logger.info("Reverted activation offload of %d modules", len(self.modules))

    def describe(self) -> dict[str, Any]:
        return {"remedy": "activation_offload", "modules": list(self.modules), "min_bytes": self.min_bytes,
                "offloaded_bytes": self.offloaded_bytes, "host_bytes": self.slab.nbytes if self.slab else 0}


def _adjacent(before: str, after: str) -> bool:
    """``before`` is the sibling just before ``after`` in a numbered run (``blocks.2``, ``blocks.3``).
    Only then is ``before`` prefetched at ``after``'s first use in backward: a block in between
    would hold it on the device through its own backward (the joint model's memory term)."""
    h1, _, n1 = before.rpartition(".")
    h2, _, n2 = after.rpartition(".")
    return h1 == h2 and n1.isdigit() and n2.isdigit() and int(n1) + 1 == int(n2)


def _last_of_run(root: nn.Module, name: str) -> bool:
    """True when ``name`` is the highest-numbered member of a numbered sibling run (``blocks.N``)."""
    head, _, last = name.rpartition(".")
    if not last.isdigit():
        return False
    parent = root.get_submodule(head) if head else root
    numbers = [int(n) for n, _ in parent.named_children() if n.isdigit()]
    return len(numbers) > 1 and int(last) == max(numbers)


def apply_activation_offload(target: Target | nn.Module, *, modules: Sequence[str],
                             checkpoint: Sequence[str] = (), min_bytes: int | None = None) -> OffloadHandle:
    """Offload what the named submodules save for backward to host memory, in place.

    ``checkpoint``: modules to checkpoint in the same apply (the joint solver's mixed plan);
    the handle's ``revert()`` undoes both.

    ``ValueError`` and nothing changed on bad names, on a module already checkpointed or
    offloaded (or inside / around one), or on the last block of a numbered run.
    """
    if isinstance(modules, str):
        raise ValueError(f"modules must be a list of names, not the string {modules!r}")
    if min_bytes is not None and (not isinstance(min_bytes, int) or min_bytes < 0):
        raise ValueError(f"min_bytes must be an integer >= 0, got {min_bytes!r}")
    root = unwrap_model(as_target(target).model_for(list(modules)))
    found = resolve_modules(root, modules)
    for name, module in found.items():
        for sub_name, sub in module.named_modules():
            if is_offloaded(sub) or is_checkpointed(sub):
                raise ValueError(f"module {name}{'.' + sub_name if sub_name else ''} is already offloaded or "
                                 "checkpointed; revert that handle first")
        if _last_of_run(root, name):
            raise ValueError(f"module {name!r} is the last block before the loss: its backward starts at once, "
                             "so its copy cannot hide; checkpoint it or offload an earlier block")
    for other_name, other in root.named_modules():
        if (is_offloaded(other) or is_checkpointed(other)) and any(n.startswith(other_name + ".") for n in found):
            raise ValueError(f"module {other_name!r} is already offloaded or checkpointed and contains a named module")
    params = list(root.parameters())
    device = params[0].device if params else torch.device("cpu")
    if isinstance(checkpoint, str) or set(checkpoint) & set(found):
        raise ValueError(f"checkpoint must be a list of names none of which is offloaded, got {checkpoint!r}")
    handle = OffloadHandle(modules=tuple(found), min_bytes=MIN_BYTES if min_bytes is None else min_bytes,
                           device=device, slab=HostSlab(device), streams=Streams(device),
                           _param_keys={p.untyped_storage()._cdata for p in params})
    if checkpoint:  # atomic on its own: raises with nothing changed
        handle.checkpoint = apply_activation_checkpointing(target, modules=list(checkpoint))
    try:
        for name, module in found.items():
            handle._patches.patch(name, module, handle.wrap(module.forward, name))
    except BaseException:
        handle.revert()
        raise
    if handle.checkpoint is not None:
        logger.info("... together with checkpointing of %s", ", ".join(checkpoint))
    logger.info("Applied activation offload to %d modules: %s", len(found), ", ".join(found))
    return handle


def check_activation_offload(target: Target) -> dict[str, str]:
    """Refused on a CPU-only job: its memory is host memory already (``_host_copies.no_accelerator``)."""
    return no_accelerator(target)
