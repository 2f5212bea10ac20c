"""ZeRO on a running DDP job, the applier half. Stage 1 (here): partition the script's own
optimizer. Stages 2 and 3: FSDP2 in place, in ``_fsdp_switch.py`` (``apply_zero`` dispatches).

In place, keeping every object the script holds (the DDP wrapper, its model, its optimizer and
the LR schedulers over it):

- the parameters are partitioned across the data-parallel ranks, greedily by size (largest
  first, to the least loaded rank), the same way on every rank;
- each rank's optimizer keeps, in every param group, only the parameters it owns, and only
  their state: the optimizer state per rank drops to about 1/N;
- DDP still all-reduces every gradient, so each owner's update is the very update the
  replicated optimizer made; after every ``step()`` the owners broadcast their updated
  parameters in place, so all replicas stay equal bit for bit;
- the gradients of parameters a rank does not own are dropped after each step (nothing reads
  them), and at the switch: PYTORCH-NOTES measured a 2.6e-3 drift when they were left to
  accumulate, since ``zero_grad`` no longer reaches them.

Numerics are unchanged (``live-exact``). ``revert()`` brings every parameter's state back to
every rank (each owner broadcasts it: the layout travels as JSON in a byte tensor, the state as
tensors; nothing is pickled) and restores the param groups' original lists. Afterwards each
rank's ``opt.state_dict()`` is complete again; while the remedy is in force it is partial, which
the predictor names as a prerequisite.
The predictor is ``recommend/remedies/zero.py``.
"""

from __future__ import annotations

import json
import weakref
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from advisor.apply.remedies._fsdp_switch import (LIVE, FsdpHandle, Reshard, is_sharded, reshard_after_forward_of,
                                                 set_stage, shard_ddp, unsupported)
from advisor.apply.target import Target, as_target

logger = logging.getLogger("advisor.apply")

PHASE = "layout"  # advisor.records.remedy.PHASES: sharding goes after every other remedy
STAGES = (1, 2, 3)
_ZERO1: "weakref.WeakValueDictionary[int, ZeroHandle]" = weakref.WeakValueDictionary()  # by id(optimizer)


def partition(sizes: list[int], world: int) -> list[int]:
    """Owner rank of each parameter: largest first, each to the least loaded rank (ties: lowest).

    Deterministic, so every rank computes the same owners without talking."""
    loads = [0] * world
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        r = min(range(world), key=lambda k: (loads[k], k))
        owners[i] = r
        loads[r] += sizes[i]
    return owners


def in_force_zero(opt: torch.optim.Optimizer) -> int:
    """The ZeRO stage this remedy has in force on ``opt``'s job (0: none, or sharded by the script
    itself). Read by the agent when the script saves a checkpoint (``advisor/agent/saves.py``)."""
    handle = _ZERO1.get(id(opt))
    if handle is not None and handle.opt is opt and not handle.reverted:
        return 1
    fsdp = LIVE.get(id(opt))
    if fsdp is not None and fsdp.opt is opt and not fsdp.reverted:
        return 3 if reshard_after_forward_of(fsdp.module) else 2
    return 0


def _ddp_of(target: Target) -> nn.Module:
    found = [w for w in target.wrappers + target.wrapped_models
             if type(w).__name__ == "DistributedDataParallel"]
    if not found:
        raise ValueError("ZeRO needs a DistributedDataParallel job: no DDP wrapper was captured")
    return found[0]


@dataclass(eq=False)
class ZeroHandle:
    """ZeRO-1 in force on one optimizer; ``revert()`` makes it replicated again."""

    opt: torch.optim.Optimizer
    group: Any  # the DDP wrapper's process group
    params: list[nn.Parameter]  # in the optimizer's original order
    owners: list[int]  # owner (rank within ``group``) of each of ``params``
    group_lists: list[list[nn.Parameter]]  # each param group's original list
    rank: int
    hook: Any = None
    reverted: bool = False
    # The state and gradients this rank dropped, kept until the first step under ZeRO: a revert
    # before that step (the ranks' vote right after the apply) is then local, with no collective
    # that a rank whose apply failed would never join.
    dropped: dict[nn.Parameter, tuple[dict[str, Any], torch.Tensor | None]] | None = field(default_factory=dict)
    ranks: list[int] = field(default_factory=list)  # group rank -> global rank

    def owned(self, r: int) -> list[nn.Parameter]:
        return [p for p, o in zip(self.params, self.owners) if o == r]

    def after_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        """Owners broadcast their updated parameters straight into every replica's storage (no
        staging buffer: ZeRO must not add a parameter-sized transient); non-owners then drop the
        gradients nobody reads any more."""
        self.commit()
        with torch.no_grad():
            for p, owner in zip(self.params, self.owners):
                _broadcast(p.detach(), src=self.ranks[owner], group=self.group)
        for p, o in zip(self.params, self.owners):
            if o != self.rank:
                p.grad = None

    def commit(self) -> None:
        """Every rank agreed to keep it (the executor calls this after the vote; the first step
        does too): release the dropped state, which only a revert at the apply's boundary needed."""
        self.dropped = None

    def revert(self) -> None:
        if self.reverted:
            return
        self.reverted = True
        if self.hook is not None:
            self.hook.remove()
        if self.dropped is not None:  # no step ran under ZeRO: put back what this rank dropped
            for group, params in zip(self.opt.param_groups, self.group_lists):
                group["params"] = list(params)
            for p, (state, grad) in self.dropped.items():
                if state:
                    self.opt.state[p] = state
                p.grad = grad
            logger.info("Reverted ZeRO-1 before its first step")
            return
        gathered: dict[nn.Parameter, dict[str, Any]] = {}
        for r in range(len(self.ranks)):
            owned = self.owned(r)
            layout = _layout(self.opt, owned) if r == self.rank else None
            layout = _broadcast_json(layout, src=self.ranks[r], group=self.group)
            for p, entry in zip(owned, layout):
                state: dict[str, Any] = {}
                for key, spec in entry.items():
                    if spec["kind"] == "tensor":
                        if r == self.rank:
                            value = self.opt.state[p][key]
                        else:
                            value = torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]),
                                                device=spec["device"])
                        _broadcast(value, src=self.ranks[r], group=self.group)
                        state[key] = value
                    else:
                        state[key] = spec["value"]
                if r != self.rank:
                    gathered[p] = state
        for group, params in zip(self.opt.param_groups, self.group_lists):
            group["params"] = list(params)
        for p, state in gathered.items():
            self.opt.state[p] = state
        logger.info("Reverted ZeRO-1: every rank holds the whole optimizer state again")


def _layout(opt: torch.optim.Optimizer, params: list[nn.Parameter]) -> list[dict[str, Any]]:
    """JSON description of each parameter's optimizer state (tensor shapes, plain values)."""
    out = []
    for p in params:
        entry: dict[str, Any] = {}
        for key, value in opt.state.get(p, {}).items():
            if isinstance(value, torch.Tensor):
                entry[str(key)] = {"kind": "tensor", "shape": list(value.shape),
                                   "dtype": str(value.dtype).removeprefix("torch."), "device": str(value.device)}
            elif isinstance(value, (int, float, bool)) or value is None:
                entry[str(key)] = {"kind": "value", "value": value}
            else:
                raise ValueError(f"cannot move optimizer state {key!r} of type {type(value).__name__}")
        out.append(entry)
    return out


def _broadcast(tensor: torch.Tensor, *, src: int, group: Any) -> None:
    """``dist.broadcast`` in place; a host tensor on an NCCL group travels through the device."""
    if tensor.device.type == "cpu" and "nccl" in str(dist.get_backend(group)):
        staged = tensor.to(torch.device("cuda", torch.cuda.current_device()))
        dist.broadcast(staged, src=src, group=group)
        tensor.copy_(staged.cpu())
    else:
        dist.broadcast(tensor, src=src, group=group)


def _broadcast_json(value: Any, *, src: int, group: Any) -> Any:
    """Broadcast a JSON-able value (given on ``src`` only) as UTF-8 bytes in a uint8 tensor: the
    receivers decode JSON, never a pickle."""
    payload = json.dumps(value).encode() if value is not None else b""
    size = torch.tensor([len(payload)], dtype=torch.int64)
    _broadcast(size, src=src, group=group)
    buf = torch.tensor(list(payload), dtype=torch.uint8) if payload else torch.empty(int(size.item()), dtype=torch.uint8)
    _broadcast(buf, src=src, group=group)
    return json.loads(bytes(buf.tolist()).decode())


def apply_zero(target: Target | nn.Module, *, stage: int) -> ZeroHandle | FsdpHandle | Reshard:
    """Shard a data-parallel job's model states across its ranks: ZeRO stage ``stage``.

    - 1: partition the DDP job's optimizer in place (``ZeroHandle``);
    - 2 or 3 on a DDP job: FSDP2 in place (``apply/remedies/_fsdp_switch.py``);
    - 2 or 3 on a model already sharded by FSDP2 (by this remedy or by the script): only
      ``set_reshard_after_forward``.

    ``ValueError`` and nothing changed when the job is not one this applier supports."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"ZeRO stage {stage!r} is not built; valid: {list(STAGES)}")
    target = as_target(target)
    sharded = [m for m in target.models if is_sharded(m)]
    if sharded:
        if stage == 1:
            raise ValueError("the model is sharded by FSDP2 already (ZeRO-2/3); revert that before ZeRO-1")
        return set_stage(sharded[0], stage)
    ddp = _ddp_of(target)
    if len(target.optimizers) != 1:
        raise ValueError(f"ZeRO needs exactly one optimizer over the model; found {len(target.optimizers)}")
    opt = target.optimizers[0]
    params = [p for g in opt.param_groups for p in g["params"]]
    model_params = {id(p) for p in ddp.module.parameters() if p.requires_grad}
    if {id(p) for p in params} != model_params or len(params) != len(model_params):
        raise ValueError("ZeRO needs the optimizer to hold exactly the DDP model's trainable parameters")
    if any(h is not None and h.opt is opt and not h.reverted for h in _ZERO1.values()):
        raise ValueError("ZeRO-1 is in force on this optimizer; revert it before another stage")
    group = getattr(ddp, "process_group", None) or dist.group.WORLD
    world = dist.get_world_size(group)
    if world < 2:
        raise ValueError("ZeRO needs a data-parallel degree above 1")
    if stage in (2, 3):
        return shard_ddp(ddp, opt, group, stage=stage)
    rank = dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group) if group is not dist.group.WORLD else list(range(world))
    owners = partition([p.numel() * p.element_size() for p in params], world)
    handle = ZeroHandle(opt=opt, group=group, params=params, owners=owners,
                        group_lists=[list(g["params"]) for g in opt.param_groups], rank=rank, ranks=ranks)
    mine = {id(p) for p, o in zip(params, owners) if o == rank}
    for g in opt.param_groups:
        g["params"] = [p for p in g["params"] if id(p) in mine]
    for p in params:
        if id(p) not in mine:
            handle.dropped[p] = (opt.state.pop(p, {}), p.grad)
            p.grad = None
    handle.hook = opt.register_step_post_hook(handle.after_step)
    _ZERO1[id(opt)] = handle
    logger.info("Applied ZeRO-1 over %d ranks: this rank owns %d of %d parameters", world, len(mine), len(params))
    return handle


def check_zero(target: Target) -> dict[str, str]:
    """ZeRO-2/3 through FSDP2 refuse what ``unsupported`` names (tied weights, a compiled model inside
    DDP, parts sharded already); ZeRO-1 keeps the model as it is."""
    ddp = [w for w in target.wrappers + target.wrapped_models if type(w).__name__ == "DistributedDataParallel"]
    if not ddp or any(is_sharded(m) for m in target.models):
        return {}
    why = unsupported(ddp[0].module)
    return {"stage=2": why, "stage=3": why} if why else {}
