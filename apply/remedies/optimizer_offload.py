"""Optimizer-state offload, the applier half (predictor: ``recommend/remedies/optimizer_offload.py``).

The script's own optimizer keeps its class, its parameter groups and its state keys; only where
the state tensors live changes. Between steps every non-scalar state tensor (Adam's moments) is a
host tensor (pinned on CUDA, registered as ``offloaded_host``); a step pre-hook copies them back
to the device and puts the device copies in ``optimizer.state``, a post-hook copies the updated
values into the same host buffers and drops the device copies. Scalar ``step`` counters stay
where they are: moving them would synchronise on every step. Values are copied bit for bit:
``live-exact``.

On CUDA the copies run on a side stream, an event every ``CHUNK_BYTES``; compute waits on the
last event before the step (the step itself is one foreach/fused call, so it cannot start on a
partial state: the chunks overlap nothing yet), and the post-hook's copies wait on the compute
stream captured at the hook; ``state_dict()`` first waits for them (the CPU reads the buffers).
The host buffers are allocated once, at the first offload, and reused. On a CPU-only build the
same code runs with same-device copies.

State created by the optimizer's first step (lazily) is offloaded by the post-hook of that step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from advisor.apply.remedies._host_copies import Streams, dense_span, host_empty, host_free, view_as
from advisor.apply.target import Target, as_target

logger = logging.getLogger("advisor.apply")

PHASE = "optimizer"  # advisor.records.remedy.PHASES
CHUNK_BYTES = 64 << 20  # bytes per side-stream copy batch on CUDA

_Key = tuple[torch.Tensor, str]  # (parameter, state key)


def _offloadable(value: Any) -> bool:
    return torch.is_tensor(value) and value.dim() > 0 and value.numel() > 0


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

    def to_host(self) -> int:
        """Copy every device state tensor into its host buffer and point the state at it."""
        moved = 0
        self.streams.capture()
        self.streams.side_waits_compute()
        with self.streams.on_side():
            for param, state in self.opt.state.items():
                for key, value in list(state.items()):
                    if (not _offloadable(value) or self._is_ours(param, key, value)
                            or value.device != self.device or not dense_span(value)):
                        continue
                    buf = self.host.get((param, key))
                    if buf is None or buf.shape != value.shape or buf.dtype != value.dtype or buf.stride() != value.stride():
                        raw = host_empty(value.numel() * value.element_size(), self.device)
                        self.raw.append(raw)
                        buf = view_as(raw, value)
                        self.host[(param, key)] = buf
                    buf.copy_(value, non_blocking=self.streams.side is not None)
                    if self.streams.side is not None:
                        value.record_stream(self.streams.side)
                    state[key] = buf
                    moved += value.numel() * value.element_size()
        self.pending = self.streams.record()  # host values complete once it fires (None off CUDA)
        return moved

    def settle(self) -> None:
        """Block the host until the last device-to-host copy ended (before the CPU reads the state)."""
        if self.pending is not None:
            self.pending.synchronize()
            self.pending = None

    def _is_ours(self, param: torch.Tensor, key: str, value: Any) -> bool:
        return self.host.get((param, key)) is value

    def to_device(self) -> None:
        """Copy the host state back to fresh device tensors, in chunks, before ``step()``."""
        self.streams.capture()
        self.streams.side_waits_compute()
        pending = 0
        event = None
        with self.streams.on_side():
            for param, state in self.opt.state.items():
                for key, value in list(state.items()):
                    if not self._is_ours(param, key, value):
                        continue
                    dev = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=self.device)
                    dev.copy_(value, non_blocking=self.streams.side is not None)
                    state[key] = dev
                    pending += value.numel() * value.element_size()
                    if pending >= CHUNK_BYTES:
                        event, pending = self.streams.record(), 0
            event = self.streams.record() if self.streams.side is not None else event
        self.streams.compute_waits(event)

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
            placement.to_device()
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
            placement = _Placement(opt=opt, device=_device_of(opt), streams=Streams(_device_of(opt)))
            handle.placements.append(placement)
            placement.to_host()
            placement.hooks.append(opt.register_step_pre_hook(lambda o, a, k, p=placement: p.to_device()))
            placement.hooks.append(opt.register_step_post_hook(lambda o, a, k, p=placement: p.to_host()))
            # state_dict() hands the host tensors to the CPU (a checkpoint save): they must be complete.
            placement.hooks.append(opt.register_state_dict_pre_hook(lambda o, p=placement: p.settle()))
            opt._advisor_offloaded = True  # type: ignore[attr-defined]
    except BaseException:
        handle.revert()  # atomic: every optimizer's state back on the device, hooks removed
        raise
    logger.info("Offloaded the state of %d optimizer(s) to host memory (%d bytes)", len(found), handle.host_bytes)
    return handle

