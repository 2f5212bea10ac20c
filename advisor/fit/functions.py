"""The script's calls that name a device: factories, moves, pinned memory, and CUDA autocast.

A ``TorchFunctionMode`` sees each call with the arguments the script wrote, before PyTorch's
Python bindings act on them (``tensor.to("cuda")`` initialises CUDA in the binding, before any
dispatch mode could answer). A call naming the target device runs on the CPU and its result is
placed on the device (``FitTensorMode.place``); a factory without a device makes host tensors, as
under python (``FitTensorMode`` places what C++ makes). While the script has CUDA autocast on,
``advisor.fit.autocast`` corrects the arguments of the calls where CUDA's policy differs from the
CPU's.

The mode is off while it handles a call, so calls nested in a Python-level torch function (a
``torch.nn.functional`` helper) are not seen here: their factories are placed by the dispatch
mode, and a device move inside one would meet the CPU-only build's refusal.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from advisor.fit.autocast import CudaPolicy
from advisor.fit.tensors import HOST, FitTensorMode

_MOVES = frozenset({"to", "cuda", "cpu"})
_PINNING = frozenset({"pin_memory"})
_PINNED = frozenset({"is_pinned"})


def _device(value: Any) -> torch.device | None:
    if value is None:
        return None
    if isinstance(value, int):  # ``tensor.cuda(0)``, ``device=0``
        return torch.device("cuda", value)
    try:
        return torch.device(value)
    except (TypeError, RuntimeError):
        return None


class DeviceCalls(TorchFunctionMode):
    """Runs calls that name the target device on the CPU and places their results there."""

    def __init__(self, mode: FitTensorMode, *, index: int = 0) -> None:
        super().__init__()
        self.mode = mode
        self.target = mode.target  # None: the target is the CPU, nothing to translate
        self.index = index  # this rank's device (LOCAL_RANK), what a bare "cuda" means
        self.autocast = CudaPolicy() if self.target == "cuda" else None

    def _place_for(self, device: torch.device | None) -> int | None | bool:
        """The place ``device`` names; False when it names neither the host nor the target (with a
        CPU target, the CPU is the host)."""
        if device is None or device.type == "cpu":
            return HOST
        if device.type == self.target:
            return device.index if device.index is not None else self.index
        return False

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name == "__deepcopy__" and args and type(args[0]) is torch.Tensor:
            # A copy of the script's real host data (a metric's default state, torchmetrics'
            # ``add_state``) is real too, as under python; under the fake mode its new storage
            # would be fake and the real tensor could not take it.
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if self.target is not None and args and isinstance(args[0], torch.Tensor):
            if name in _MOVES:
                return self._move(name, args, kwargs)
            if name in _PINNING:
                return args[0]  # the host copy a fit has no use for pinning
            if name in _PINNED:
                return False
        if self.autocast is not None:
            cast = self.autocast.cast(name, args, kwargs)
            if cast is not None:
                args, kwargs = cast
        named = "device" in kwargs
        place = self._place_for(_device(kwargs["device"])) if named else HOST
        if named and place is not False and self.target is not None:
            kwargs["device"] = "cpu"
        if place is HOST and not _has_tensor((args, kwargs)) and not _in_module_construction():
            # A factory on the host (a device-less one: the default device's, the CPU unless the
            # script set one, whose device context passes it on as ``device=``), outside a
            # module's construction: the script's own host data (random indices, a batch built
            # by hand), made for real, so that reading it works as under python.
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        result = func(*args, **kwargs)
        if named and place is not False:
            self.mode.place_all(result, place)
        elif not named and not _has_tensor((args, kwargs)):
            self.mode.place_all(result, HOST)  # made in a module's construction: fake, on the host
        return result

    def _move(self, name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        tensor = args[0]
        copy = bool(kwargs.pop("copy", False))
        dtype = memory_format = None
        non_blocking = bool(kwargs.pop("non_blocking", False))
        if name == "cuda":
            device: torch.device | None = _device(args[1] if len(args) > 1 else kwargs.pop("device", None)) \
                or torch.device(self.target, self.index)
            if device.type != self.target:
                device = torch.device(self.target, device.index)
            memory_format = kwargs.pop("memory_format", None)
        elif name == "cpu":
            device = torch.device("cpu")
            memory_format = kwargs.pop("memory_format", None)
        elif len(args) > 1 and isinstance(args[1], torch.Tensor):  # tensor.to(other)
            device, dtype = args[1].device, args[1].dtype
        else:
            device, dtype, non_blocking_parsed, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
            non_blocking = non_blocking or non_blocking_parsed
        source = self.mode.place_of(tensor)
        wanted = source if device is None else self._place_for(device)
        if wanted is False:  # another device type (meta, ...): as PyTorch does it
            return tensor.to(device, dtype, non_blocking=non_blocking, copy=copy,
                             **({"memory_format": memory_format} if memory_format is not None else {}))
        extra = {"memory_format": memory_format} if memory_format is not None else {}
        if wanted == source and not copy:
            result = tensor.to(dtype=dtype, non_blocking=non_blocking, **extra) if dtype is not None \
                else tensor.to(non_blocking=non_blocking, **extra)
            if result is tensor:
                return tensor
        else:  # a copy to the other side, as PyTorch makes one
            if wanted is not HOST and not isinstance(tensor, FakeTensor):
                tensor = self.mode.from_tensor(tensor)  # real host data becomes fake on the device
            result = tensor.to(dtype=dtype if dtype is not None else tensor.dtype, non_blocking=non_blocking,
                               copy=True, **extra)
        self.mode.place(result, wanted)
        return result


def _in_module_construction() -> bool:
    """Whether an ``nn.Module``'s ``__init__`` is on the stack: what it makes is the model's
    (parameters, buffers), fake even on the host, so that a model larger than this machine's
    memory can be built and planned."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), torch.nn.Module):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _has_tensor(value: Any) -> bool:
    return any(isinstance(t, torch.Tensor) for t in tree_flatten(value)[0])
