"""Which storages are parameters, gradients and optimizer state, and how categories are chosen.

A storage is keyed by ``untyped_storage()._cdata`` (the address of its ``StorageImpl``): views
and in-place results share it, so one allocation is counted once whatever tensors point at it.
The key is only valid while the storage lives; the tracker drops it when the storage is freed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator

from advisor.records.samples import MEMORY_CATEGORIES

if TYPE_CHECKING:  # pragma: no cover
    import torch

# Roles found by walking the models and optimizers, strongest first.
ROLE_CATEGORIES: tuple[str, ...] = ("parameter", "gradient", "optimizer_state")

# When a storage qualifies for several categories the first wins. The data batch counts as input
# even when the first layer saves it for backward: checkpointing could not free it.
PRIORITY: tuple[str, ...] = MEMORY_CATEGORIES


def storage_of(tensor: "torch.Tensor") -> "torch.UntypedStorage | None":
    """The tensor's untyped storage, or None for tensors without one (sparse, wrapper subclasses).

    A ``DTensor``'s is its local shard's: the wrapper reports a storage of the global size that
    holds no memory (FSDP2's parameters and the optimizer state and gradients sharded with them)."""
    try:
        return local_part(tensor).untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def device_type_of(tensor: "torch.Tensor") -> str:
    """The device type the tensor is on, as the script sees it (``tensor.device``: a DTensor's is
    its shard's). Not its storage's: a fake tensor's storage is on ``meta`` whatever device it
    stands for (``advisor fit``), and a real tensor's storage is where the tensor is."""
    return local_part(tensor).device.type


def storage_key(tensor: "torch.Tensor") -> tuple[int, int] | None:
    """(key, nbytes) of the tensor's storage; None when it has none or it is empty."""
    storage = storage_of(tensor)
    if storage is None:
        return None
    nbytes = storage.nbytes()
    if nbytes == 0:
        return None
    return storage._cdata, nbytes


def tensors_in(value: object) -> Iterator["torch.Tensor"]:
    """Tensors inside an op's or module's arguments/outputs (lists, tuples and dicts, recursively)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def live_tensors() -> list["torch.Tensor"]:
    """Every tensor the garbage collector tracks (what was alive before the tracker began).

    type() not isinstance(): isinstance consults ``__class__``, which some module objects answer
    with a deprecation warning. The answer is kept per type, since a process holds a few hundred
    types and a hundred thousand objects or more: a third less time than asking every object (the
    scan is part of the light step before the first deep step)."""
    import gc

    import torch

    is_tensor: dict[type, bool] = {}
    found = []
    for obj in gc.get_objects():
        kind = type(obj)
        hit = is_tensor.get(kind)
        if hit is None:
            hit = is_tensor[kind] = issubclass(kind, torch.Tensor)
        if hit:
            found.append(obj)
    return found


_PLAIN: tuple[type, ...] = ()  # torch.Tensor and nn.Parameter, once torch is imported


def local_part(tensor: "torch.Tensor") -> "torch.Tensor":
    """This process's part of a tensor: a ``DTensor``'s local shard (FSDP2's sharded parameters,
    their gradients and optimizer state), else the tensor itself. A DTensor is a wrapper without
    a storage of its own, so its bytes on this rank are its local tensor's."""
    global _PLAIN
    if type(tensor) in _PLAIN:  # the common case, first and cheap: called ~80 times per parameter per deep step
        return tensor
    import sys

    import torch

    _PLAIN = (torch.Tensor, torch.nn.Parameter)  # no DTensor is one (torch is imported lazily here)
    if type(tensor) in _PLAIN:
        return tensor
    module = sys.modules.get("torch.distributed.tensor")  # imported by whoever made a DTensor
    dtensor = getattr(module, "DTensor", None) if module is not None else None
    if dtensor is not None and isinstance(tensor, dtensor):
        return tensor.to_local()
    return tensor


def role_tensors(
    models: Iterable["torch.nn.Module"], optimizers: Iterable["torch.optim.Optimizer"]
) -> Iterator[tuple[str, "torch.Tensor"]]:
    """(role, tensor) for parameters, their ``.grad`` and every tensor in ``optimizer.state``.

    Optimizer parameters not in a discovered model still count as parameters. Adam's scalar
    ``step`` tensors live in ``optimizer.state`` and so count as optimizer state.
    """
    # Each parameter once: the model's and its optimizer's lists name the same tensors (a third of
    # the walk, and of its gradients', at 5001 modules).
    seen: set[int] = set()
    params: list["torch.Tensor"] = []
    for group_params in (*(model.parameters() for model in models),
                         *(group["params"] for opt in optimizers for group in opt.param_groups)):
        for p in group_params:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    for p in params:
        yield "parameter", local_part(p)
    for p in params:
        if p.grad is not None:
            yield "gradient", local_part(p.grad)
    for opt in optimizers:
        for state in opt.state.values():
            for value in tensors_in(state):
                yield "optimizer_state", local_part(value)


def choose_category(
    role: str | None, *, saved: bool, created_step: int, step: int, origin: str, offloaded: bool = False
) -> str:
    """The category of one live storage now (see ``PRIORITY``).

    ``origin`` is ``"input"`` for storages created in the data phase of ``created_step``,
    ``"temporary"`` for the rest created by an op, ``"other"`` for storages found already alive.
    ``offloaded``: an offload remedy's host copy (``advisor.records.host_memory``); it wins over a
    role, because offloaded optimizer state is still in ``optimizer.state``.
    """
    if offloaded:
        return "offloaded_host"
    if role is not None:
        return role
    current = created_step == step
    if current and origin == "input":
        return "input"
    if saved:
        return "activation"
    if current and origin == "temporary":
        return "temporary"
    return "other"
