"""Optimizer-state offload, the applier half (predictor: ``recommend/remedies/optimizer_offload.py``).

The script's own optimizer keeps its class, its parameter groups and its state keys; only where
the state tensors live changes. Between steps every non-scalar state tensor (Adam's moments) is a
host tensor (pinned on CUDA, registered as ``offloaded_host``); a step pre-hook copies them back
to the device and puts the device copies in ``optimizer.state``, a post-hook copies the updated
values into the same host buffers and drops the device copies. Scalar ``step`` counters stay
where they are: moving them would synchronise on every step. Values are copied bit for bit:
``live-exact``.

The step runs in chunks of about ``CHUNK_BYTES`` of state so that copies and compute overlap:
while chunk k steps on the compute stream, chunk k+1's state comes up and chunk k-1's goes down on
the side stream; the compute stream waits on chunk k's "arrived" event only (CUDA events,
``Stream.wait_event``, ``Tensor.record_stream``: documented APIs). Only ~3 chunks of state are on
the device at once, so ``step()`` no longer needs all of it. How: the instance pre-hook (after the
global pre-hooks, so the agent's step phase starts first) steps chunks 0..n-2 by calling the
optimizer's own unhooked step (PyTorch keeps it as ``type(opt).step.__wrapped__`` where
``hooked`` is set) with each group's ``params`` narrowed to the chunk, then leaves the groups
narrowed to the last chunk for the real call; the instance post-hook (before the global ones)
restores the groups. Chunking is used only for optimizers whose update is per parameter
(``CHUNKABLE``, exact classes, no closure), where stepping a subset is the same arithmetic; any
other optimizer, a closure, or a PyTorch without ``__wrapped__`` takes one chunk (all state up,
step, all down). ``state_dict()`` first waits for the copies (the CPU reads the buffers). The host
buffers are allocated once, at the first offload, and reused. On a CPU-only build the same code
runs with same-device copies and no events, chunks included: that is how exactness is tested.

State created by the optimizer's first step (lazily) is offloaded by the post-hook of that step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch.distributed.tensor import DTensor

from advisor.apply.remedies._host_copies import Streams, dense_span, host_empty, host_free, no_accelerator, view_as
from advisor.apply.target import Target, as_target

logger = logging.getLogger("advisor.apply")

PHASE = "placement"  # advisor.records.remedy.PHASES: after sharding, which it must not see
CHUNK_BYTES = 64 << 20  # bytes per side-stream copy batch on CUDA

_Key = tuple[torch.Tensor, str]  # (parameter, state key)
# Optimizers whose update of one parameter reads only that parameter's gradient and state: a
# step over a subset of the parameters is the same arithmetic for that subset.
CHUNKABLE = tuple(getattr(torch.optim, n) for n in ("SGD", "Adam", "AdamW", "Adagrad", "Adamax", "NAdam", "RAdam",
                                                    "RMSprop", "Adadelta", "Rprop", "ASGD") if hasattr(torch.optim, n))


def _offloadable(value: Any) -> bool:
    return torch.is_tensor(value) and value.dim() > 0 and value.numel() > 0


def _local(value: Any) -> Any:
    """A DTensor's shard on this rank (the state of an FSDP2-sharded parameter); anything else as is."""
    return value.to_local() if isinstance(value, DTensor) else value


def _shaped_like(local: torch.Tensor, like: Any) -> Any:
    """``local`` as the state value ``like`` was: a DTensor of the same layout around it where
    ``like`` is one (built as FSDP2 builds its CPU-offloaded shards, so the host shard stays
    where it is: ``DTensor.from_local`` would move it to the mesh's device), else ``local``."""
    if not isinstance(like, DTensor):
        return local
    return DTensor(local, like._spec, requires_grad=False)  # type: ignore[call-arg]


def _raw_step(opt: torch.optim.Optimizer) -> Any:
    """The optimizer's step without the hook wrapper PyTorch puts around it, or None."""
    hooked = type(opt).step
    inner = getattr(hooked, "__wrapped__", None)
    return inner if getattr(hooked, "hooked", False) and callable(inner) else None


@dataclass(eq=False)
class _Placement:
    """One optimizer's host buffers (reused every step) and where its device tensors lived."""

    opt: torch.optim.Optimizer
    device: torch.device
    streams: Streams
    host: dict[_Key, torch.Tensor] = field(default_factory=dict)
    raw: list[torch.Tensor] = field(default_factory=list)  # the uint8 buffers, to unregister
    hooks: list[Any] = field(default_factory=list)
    pending: Any = None  # CUDA event after the last device-to-host copy
    chunk_bytes: int = CHUNK_BYTES
    chunks_run: int = 0  # chunks of the last step (1 when it could not be chunked)
    _full: list[list[torch.Tensor]] | None = None  # each group's params while narrowed to the last chunk
    _last: list[torch.Tensor] = field(default_factory=list)

    def to_host(self, params: Sequence[torch.Tensor] | None = None) -> int:
        """Copy the device state of ``params`` (default: all) into host buffers and point the
        state at them; the side stream waits for the compute queued so far."""
        moved = 0
        self.streams.capture()
        self.streams.side_waits_compute()
        with self.streams.on_side():
            for param in (self.opt.state if params is None else params):
                state = self.opt.state.get(param, {})
                for key, value in list(state.items()):
                    local = _local(value)
                    if (not _offloadable(local) or self._is_ours(param, key, value)
                            or local.device != self.device or not dense_span(local)):
                        continue
                    placed = self.host.get((param, key))
                    buf = None if placed is None else _local(placed)
                    if buf is None or buf.shape != local.shape or buf.dtype != local.dtype or buf.stride() != local.stride():
                        raw = host_empty(local.numel() * local.element_size(), self.device)
                        self.raw.append(raw)
                        buf = view_as(raw, local)
                    placed = self.host[(param, key)] = _shaped_like(buf, value)
                    buf.copy_(local, non_blocking=self.streams.side is not None)
                    if self.streams.side is not None:
                        local.record_stream(self.streams.side)  # freed only after the copy ran
                    state[key] = placed
                    moved += local.numel() * local.element_size()
        self.pending = self.streams.record()  # host values complete once it fires (None off CUDA)
        return moved

    def settle(self) -> None:
        """Block the host until the last device-to-host copy ended (before the CPU reads the state),
        and undo a narrowing a failed step left behind."""
        self._restore_groups()
        if self.pending is not None:
            self.pending.synchronize()
            self.pending = None

    def _is_ours(self, param: torch.Tensor, key: str, value: Any) -> bool:
        return self.host.get((param, key)) is value

    def to_device(self, params: Sequence[torch.Tensor] | None = None) -> Any:
        """Queue the host state of ``params`` (default: all) back to fresh device tensors on the
        side stream; the event after those copies (None off CUDA)."""
        self.streams.capture()
        self.streams.side_waits_compute()
        with self.streams.on_side():
            for param in (list(self.opt.state) if params is None else params):
                state = self.opt.state.get(param, {})
                for key, value in list(state.items()):
                    if not self._is_ours(param, key, value):
                        continue
                    host = _local(value)
                    dev = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=self.device)
                    dev.copy_(host, non_blocking=self.streams.side is not None)
                    state[key] = _shaped_like(dev, value)
        return self.streams.record()

    # -- the chunked step -----------------------------------------------------------------
    def chunks(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[list[torch.Tensor]]:
        """The step's parameters in group order, cut every ``chunk_bytes`` of state (a parameter
        without state yet counts twice its own bytes: Adam's two moments); one chunk when this
        optimizer cannot be chunked."""
        params = [p for group in self.opt.param_groups for p in group["params"]]
        closure = len(args) > 1 or kwargs.get("closure") is not None
        if type(self.opt) not in CHUNKABLE or closure or _raw_step(self.opt) is None:
            return [params]
        held: dict[int, int] = {}
        for (param, _), placed in self.host.items():
            buf = _local(placed)
            held[id(param)] = held.get(id(param), 0) + buf.numel() * buf.element_size()
        out: list[list[torch.Tensor]] = [[]]
        size = 0
        for p in params:
            nbytes = held.get(id(p)) or 2 * p.numel() * p.element_size()
            if out[-1] and size + nbytes > self.chunk_bytes:
                out.append([])
                size = 0
            out[-1].append(p)
            size += nbytes
        return out

    def _narrow(self, chunk: Sequence[torch.Tensor]) -> None:
        keep = {id(p) for p in chunk}
        if self._full is None:
            self._full = [group["params"] for group in self.opt.param_groups]
        for group, full in zip(self.opt.param_groups, self._full):
            group["params"] = [p for p in full if id(p) in keep]

    def _restore_groups(self) -> None:
        if self._full is not None:
            for group, full in zip(self.opt.param_groups, self._full):
                group["params"] = full
            self._full = None

    def before_step(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Step every chunk but the last, each overlapping the next one's upload and the previous
        one's download; leave the groups narrowed to the last chunk for the real call."""
        chunks = self.chunks(args, kwargs)
        self.chunks_run = len(chunks)
        arrived = self.to_device(chunks[0])
        if len(chunks) == 1:
            self.streams.compute_waits(arrived)
            self._last = chunks[0]
            return
        raw = _raw_step(self.opt)
        try:
            for k, chunk in enumerate(chunks):
                following = self.to_device(chunks[k + 1]) if k + 1 < len(chunks) else None
                self.streams.compute_waits(arrived)
                self._narrow(chunk)
                if k == len(chunks) - 1:
                    break  # the real step runs this one, with the hooks
                raw(*args, **kwargs)
                self.to_host(chunk)
                arrived = following
        except BaseException:
            self._restore_groups()
            raise
        self._last = chunks[-1]

    def after_step(self) -> None:
        self._restore_groups()
        self.to_host(self._last)
        self._last = []

    def free(self) -> None:
        for raw in self.raw:
            host_free(raw)
        self.raw, self.host = [], {}


@dataclass(eq=False)
class OptimizerOffloadHandle:
    """The optimizers whose state lives on the host between steps; ``revert()`` brings it back."""

    placements: list[_Placement] = field(default_factory=list)
    reverted: bool = False

    @property
    def host_bytes(self) -> int:
        return sum(r.numel() for p in self.placements for r in p.raw)

    def revert(self) -> None:
        """Remove the hooks and put every state tensor back on the device, as fresh tensors."""
        if self.reverted:
            return
        for placement in reversed(self.placements):
            for hook in placement.hooks:
                hook.remove()
            placement.settle()  # a failed step may have left the groups narrowed
            placement.streams.compute_waits(placement.to_device())
            placement.free()
            placement.opt._advisor_offloaded = False  # type: ignore[attr-defined]
        self.reverted = True
        logger.info("Reverted optimizer-state offload of %d optimizer(s)", len(self.placements))

    def describe(self) -> dict[str, Any]:
        return {"remedy": "optimizer_offload", "optimizers": len(self.placements), "host_bytes": self.host_bytes}


def _device_of(opt: torch.optim.Optimizer) -> torch.device:
    for group in opt.param_groups:
        for p in group["params"]:
            return p.device
    return torch.device("cpu")


def apply_optimizer_offload(target: Target | torch.nn.Module, *, optimizers: Sequence[int] | None = None
                            ) -> OptimizerOffloadHandle:
    """Keep the state of the target's optimizers (all, or those at ``optimizers`` indexes) on the host
    between steps. ``ValueError`` and nothing changed when there is no optimizer to offload."""
    found = as_target(target).optimizers
    if optimizers is not None:
        if isinstance(optimizers, (str, bytes)) or not all(isinstance(i, int) and 0 <= i < len(found) for i in optimizers):
            raise ValueError(f"optimizers must be a list of indexes in 0..{len(found) - 1}, got {optimizers!r}")
        found = [found[i] for i in optimizers]
    if not found:
        raise ValueError("no optimizer captured to offload; the script must build one before the apply step")
    for opt in found:
        if getattr(opt, "_advisor_offloaded", False):
            raise ValueError(f"{type(opt).__name__}'s state is already offloaded; revert that handle first")
    handle = OptimizerOffloadHandle()
    try:
        for opt in found:
            placement = _Placement(opt=opt, device=_device_of(opt), streams=Streams(_device_of(opt)),
                                   chunk_bytes=CHUNK_BYTES)
            handle.placements.append(placement)
            placement.to_host()
            placement.hooks.append(opt.register_step_pre_hook(lambda o, a, k, p=placement: p.before_step(a, k)))
            placement.hooks.append(opt.register_step_post_hook(lambda o, a, k, p=placement: p.after_step()))
            # state_dict() hands the host tensors to the CPU (a checkpoint save): they must be complete.
            placement.hooks.append(opt.register_state_dict_pre_hook(lambda o, p=placement: p.settle()))
            opt._advisor_offloaded = True  # type: ignore[attr-defined]
    except BaseException:
        handle.revert()  # atomic: every optimizer's state back on the device, hooks removed
        raise
    logger.info("Offloaded the state of %d optimizer(s) to host memory (%d bytes)", len(found), handle.host_bytes)
    return handle


def check_optimizer_offload(target: Target) -> dict[str, str]:
    """Refused on a CPU-only job: its memory is host memory already (``_host_copies.no_accelerator``)."""
    return no_accelerator(target)
