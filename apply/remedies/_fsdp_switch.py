"""ZeRO-2 and ZeRO-3 on a running DDP job through FSDP2, in place, and back.

The script holds its DDP wrapper, the module under it, its optimizer and the LR schedulers over
that optimizer; all of them keep working:

1. ``fully_shard`` (``torch.distributed.fsdp``) is applied to each block of the user's module,
   then to the module itself, on a mesh over the DDP wrapper's own process group, with
   ``reshard_after_forward`` False for ZeRO-2 (parameters stay gathered from forward to
   backward; gradients and optimizer state are sharded) and True for ZeRO-3 (parameters are
   gathered again in backward). FSDP2 replaces every parameter by a new sharded ``DTensor``
   parameter and changes the module's class in place.
2. The optimizer's ``param_groups`` get the new parameters in place of the old ones (matched by
   name), and its state is sharded the same way: each rank keeps the ``Shard(0)`` chunk of each
   state tensor that FSDP2 gave it of the parameter. ``distribute_tensor(..., src_data_rank=None)``
   takes the local chunk with no collective: every DDP replica holds the same full state, and a
   collective here would hang if a peer's apply had failed before reaching it. The optimizer's
   class is never swapped: an LR scheduler has wrapped its bound ``step``.
3. The DDP wrapper's ``forward`` (the loop still calls the wrapper) is routed to the sharded
   module: DDP's reducer no longer sees a gradient, and ``no_sync()`` maps to FSDP2's
   ``set_requires_gradient_sync``; buffers are broadcast from the first rank as DDP does.

Until ``commit()`` (the ranks' vote right after the apply, or the first forward) the old
parameters, their gradients and their optimizer state are kept as they were: a revert then is
local and needs no collective. ``commit()`` releases them (the old parameter objects stay, with
empty data, because DDP's reducer holds them). A later ``revert()`` gathers the
full parameters and optimizer state (``DTensor.full_tensor``, the same order on every rank) into
the old objects, undoes ``fully_shard`` and restores DDP's forward.

Undoing ``fully_shard`` has no public API (torch 2.13): it removes FSDP's forward hooks and
module state, and restores the module classes. That is private FSDP2 state, checked by the tests
(a reverted job trains on under DDP with the same losses); re-check it on each torch upgrade.

DDP's gradient buckets (one flat tensor per bucket, the size of the gradients, inside the C++
reducer) stay allocated while FSDP2 is in force: the reducer has no API to free them, and a
revert needs them. The predictor counts them.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

logger = logging.getLogger("advisor.apply")
# Each switch in force, by id(optimizer): what the agent's save watch asks (``zero.in_force_zero``).
LIVE: "weakref.WeakValueDictionary[int, FsdpHandle]" = weakref.WeakValueDictionary()


def blocks_of(module: nn.Module) -> list[nn.Module]:
    """The units FSDP2 shards one by one: the entries of the outermost ``ModuleList``s (a
    transformer's layers), else the parameterised children of a ``Sequential`` root; the root
    is sharded last and takes what is left. Never a module inside another block."""
    blocks: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            if isinstance(child, nn.ModuleList):
                blocks.extend(c for c in child if any(True for _ in c.parameters()))
            else:
                visit(child)

    visit(module)
    if not blocks and isinstance(module, nn.Sequential):
        blocks = [c for c in module if any(True for _ in c.parameters())]
    return blocks


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def fsdp_modules(module: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def reshard_after_forward_of(module: nn.Module) -> bool | None:
    """Whether FSDP2 reshards the parameters of ``module``'s units after forward (True: ZeRO-3),
    or None when the units disagree or nothing is sharded. Source: each param group's
    ``post_forward_mesh_info`` (FSDP2 internal; set by ``set_reshard_after_forward``)."""
    values = set()
    for m in fsdp_modules(module):
        state = m._get_fsdp_state()  # type: ignore[operator]
        groups = getattr(state, "_fsdp_param_groups", None)  # torch 2.13; one group before it
        if groups is None:
            groups = [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
        for group in groups:
            values.add(group.post_forward_mesh_info is not None)
    return values.pop() if len(values) == 1 else None


@dataclass(eq=False)
class Reshard:
    """ZeRO-2 <-> ZeRO-3 on modules already sharded by FSDP2: ``set_reshard_after_forward``."""

    root: nn.Module
    before: bool
    reverted: bool = False

    def revert(self) -> None:
        if not self.reverted:
            self.reverted = True
            self.root.set_reshard_after_forward(self.before)  # type: ignore[operator]
            logger.info("Reverted to reshard_after_forward=%s", self.before)


def set_stage(root: nn.Module, stage: int) -> Reshard:
    before = reshard_after_forward_of(root)
    if before is None:
        raise ValueError("the FSDP2 units of this model reshard inconsistently; the ZeRO stage is not 2 or 3")
    root.set_reshard_after_forward(stage == 3)  # type: ignore[operator]
    logger.info("Set ZeRO-%d on the FSDP2 model (reshard_after_forward=%s)", stage, stage == 3)
    return Reshard(root=root, before=before)


@dataclass(eq=False)
class _Original:
    """One parameter as DDP knew it."""

    name: str
    owner: nn.Module  # the module whose ``_parameters`` holds it
    attr: str
    param: nn.Parameter
    shape: torch.Size
    grad: torch.Tensor | None
    state: dict[str, Any]  # its optimizer state (the full, replicated one)


@dataclass(eq=False)
class FsdpHandle:
    """ZeRO-2/3 through FSDP2 in force on a DDP job; ``revert()`` brings DDP back."""

    ddp: nn.Module
    module: nn.Module
    opt: torch.optim.Optimizer
    stage: int
    originals: list[_Original]
    group_lists: list[list[nn.Parameter]]  # each param group's original list
    classes: list[tuple[nn.Module, type]]  # sharded module -> its class before fully_shard
    managed: list[nn.Module]
    committed: bool = False
    reverted: bool = False
    _route: Any = None

    def new_params(self) -> list[nn.Parameter]:
        return [o.owner._parameters[o.attr] for o in self.originals]  # type: ignore[misc]

    def commit(self) -> None:
        """Every rank keeps it: free the replicated parameters, gradients and optimizer state."""
        if self.committed or self.reverted:
            return
        self.committed = True
        for o in self.originals:
            o.grad = None
            o.param.grad = None
            o.state = {}
            # DDP's reducer keeps the parameter object; only its data goes. Swapping ``.data`` (not
            # resizing the storage to 0) drops the last reference, so a memory tracker that
            # watches storages being freed sees it go.
            o.param.data = o.param.data.new_empty(0)

    def revert(self) -> None:
        if self.reverted:
            return
        if self.committed:
            self._gather()
        self.reverted = True
        for p in self.new_params():
            self.opt.state.pop(p, None)
        _unshard(self)
        for group, params in zip(self.opt.param_groups, self.group_lists):
            group["params"] = list(params)
        for o in self.originals:
            if o.state:
                self.opt.state[o.param] = o.state
            o.param.grad = o.grad
        self.ddp.__dict__.pop("forward", None)
        logger.info("Reverted ZeRO-%d: DDP again, every rank holds the whole model state", self.stage)

    def _gather(self) -> None:
        """All-gather each parameter and its optimizer state into the old objects (a collective
        per tensor, in the same order on every rank)."""
        from torch.distributed.tensor import DTensor

        for m in fsdp_modules(self.module):  # a forward without backward (an eval) may have left
            m.reshard()  # type: ignore[operator]  # gathered parameters registered: the state is keyed by the shards
        new = self.new_params()
        for o, p in zip(self.originals, new):
            with torch.no_grad():
                full = p.full_tensor() if isinstance(p, DTensor) else p.detach()
                o.param.data = full.reshape(o.shape).clone(memory_format=torch.contiguous_format)
            state: dict[str, Any] = {}
            for key, value in self.opt.state.get(p, {}).items():
                state[key] = value.full_tensor() if isinstance(value, DTensor) else value
            o.state = state
            o.grad = None


def _unshard(handle: FsdpHandle) -> None:
    """Undo ``fully_shard`` on every module it was applied to (see the module docstring)."""
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY
    from torch.distributed._composable_state import _module_state_mapping

    for module, cls in reversed(handle.classes):
        state = module._get_fsdp_state()  # type: ignore[operator]
        for h in {id(state._pre_forward_hook_handle): state._pre_forward_hook_handle,
                  id(state._post_forward_hook_handle): state._post_forward_hook_handle}.values():
            h.remove()
        _module_state_mapping.pop(module, None)
        module.__dict__.pop(STATE_KEY, None)
        module.__dict__.pop(REGISTRY_KEY, None)
        module.__class__ = cls
    for m in handle.managed:
        m.__dict__.pop("_is_fsdp_managed_module", None)
        m.__dict__.pop("_fsdp_use_orig_params", None)
    for o in handle.originals:
        o.owner._parameters[o.attr] = o.param


class _Route:
    """The DDP wrapper's ``forward`` while FSDP2 is in force: the sharded module's ``__call__``
    (its hooks gather the parameters), with DDP's ``no_sync`` and buffer broadcast kept."""

    def __init__(self, ddp: nn.Module, module: nn.Module, group: Any) -> None:
        self.ddp, self.module, self.group = ddp, module, group
        self.on_first: Callable[[], None] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.on_first is not None:
            first, self.on_first = self.on_first, None
            first()
        self.module.set_requires_gradient_sync(  # type: ignore[operator]
            bool(getattr(self.ddp, "require_backward_grad_sync", True)))
        if getattr(self.ddp, "broadcast_buffers", False):
            src = dist.get_global_rank(self.group, 0) if self.group is not dist.group.WORLD else 0
            with torch.no_grad():
                for b in self.module.buffers():
                    dist.broadcast(b, src=src, group=self.group)
        return self.module(*args, **kwargs)


def unsupported(module: nn.Module) -> str | None:
    """Why FSDP2 cannot shard ``module`` in place here, or None."""
    if type(module).__name__ == "OptimizedModule":
        return "it is compiled (torch.compile) inside DDP; FSDP2 would shard the compiled wrapper"
    shared = len(list(module.named_parameters(remove_duplicate=False))) - len(list(module.parameters()))
    if shared:
        return f"{shared} parameter(s) are shared between modules (tied weights), which would land in different units"
    if any(is_sharded(m) for m in module.modules()):
        return "parts of it are sharded by FSDP2 already"
    return None


def shard_ddp(ddp: nn.Module, opt: torch.optim.Optimizer, group: Any, *, stage: int) -> FsdpHandle:
    """Switch a DDP job to ZeRO-``stage`` (2 or 3) through FSDP2; atomic: raises with the job
    unchanged (every partial step undone locally)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, distribute_tensor

    module = ddp.module
    refusal = unsupported(module)
    if refusal:
        raise ValueError(f"ZeRO-{stage} through FSDP2 does not support this model: {refusal}")
    names = {id(p): n for n, p in module.named_parameters()}
    originals = []
    for p in (p for g in opt.param_groups for p in g["params"]):
        name = names[id(p)]
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        originals.append(_Original(name=name, owner=owner, attr=attr, param=p, shape=p.shape, grad=p.grad,
                                   state=dict(opt.state.get(p, {}))))
    params = [o.param for o in originals]
    if any(isinstance(p, DTensor) for p in params):
        raise ValueError("the model's parameters are already DTensors (tensor parallel?); ZeRO-2/3 supports plain DDP")
    device = params[0].device
    blocks = blocks_of(module)
    handle = FsdpHandle(ddp=ddp, module=module, opt=opt, stage=stage, originals=originals,
                        group_lists=[list(g["params"]) for g in opt.param_groups],
                        classes=[], managed=list(module.modules()))
    try:
        mesh = DeviceMesh.from_group(group, device.type)
        for unit in [*blocks, module]:
            cls = type(unit)
            fully_shard(unit, mesh=mesh, reshard_after_forward=stage == 3)
            handle.classes.append((unit, cls))
        new = handle.new_params()
        by_old = {id(o.param): p for o, p in zip(originals, new)}
        for g in opt.param_groups:
            g["params"] = [by_old[id(p)] for p in g["params"]]
        for o, p in zip(originals, new):
            opt.state.pop(o.param, None)
            if o.state:
                opt.state[p] = {k: _shard_like(v, p, o.param, distribute_tensor) for k, v in o.state.items()}
            o.param.grad = None
    except BaseException:
        handle.reverted = True
        for o in originals:
            for p in [o.owner._parameters.get(o.attr)]:
                if p is not None and p is not o.param:
                    opt.state.pop(p, None)
        if handle.classes:
            _unshard(handle)
        for g, params_ in zip(opt.param_groups, handle.group_lists):
            g["params"] = list(params_)
        for o in originals:
            if o.state:
                opt.state[o.param] = o.state
            o.param.grad = o.grad
        raise
    route = _Route(ddp, module, group)
    route.on_first = handle.commit  # a forward ran: the remedy is in use, so the vote was to keep it
    handle._route = route
    ddp.forward = route  # instance attribute: nn.Module.__call__ finds it before DDP.forward
    LIVE[id(opt)] = handle
    logger.info("Applied ZeRO-%d through FSDP2 over %d ranks: %d blocks and the root sharded",
                stage, dist.get_world_size(group), len(blocks))
    return handle


def _shard_like(value: Any, param: Any, old: nn.Parameter, distribute_tensor: Any) -> Any:
    """One optimizer-state value for the sharded parameter ``param``: a tensor shaped like the
    full parameter becomes this rank's chunk of it (a copy: the full one is kept until commit);
    anything else (Adam's ``step``) is copied as it is."""
    if isinstance(value, torch.Tensor) and value.shape == old.shape and value.dim() > 0:
        local = distribute_tensor(value.detach(), param.device_mesh, param.placements, src_data_rank=None)
        return local.detach().clone()
    return value.clone() if isinstance(value, torch.Tensor) else value
