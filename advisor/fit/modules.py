"""``module.to(device)`` on fake parameters, keeping the parameter objects.

``nn.Module._apply`` swaps a fake parameter with its converted copy (``torch.utils.swap_tensors``),
which a fake tensor refuses: the fake mode holds a weak reference to it (torch 2.13). A fit's
fake tensors are all CPU tensors to PyTorch (``advisor.fit.tensors``), so the converted tensor can
be set as the parameter's data instead, as ``_apply`` does for ordinary tensors: the parameter
stays the same object (an optimizer built before the move, and tied weights such as
``lm_head.weight = wte.weight``, still hold it) and takes the converted storage, with its place.
Buffers are replaced by their converted copies, as ``_apply`` does. Hooks a script registered on
``_apply`` itself are not run.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor

from advisor.fit.patches import Patches


def install_module_moves(patches: Patches) -> None:
    original = torch.nn.Module._apply

    def _apply(self: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        tensors = [*self._parameters.values(), *self._buffers.values()]
        if not any(isinstance(t, FakeTensor) for t in tensors if t is not None):
            if recurse:
                for child in self.children():
                    child._apply(fn)
            return _apply_plain(self, original, fn)
        if recurse:
            for child in self.children():
                child._apply(fn)
        for param in self._parameters.values():
            if param is None:
                continue
            with torch.no_grad():
                converted = fn(param)
            if converted is not param:
                param.data = converted
            grad = param.grad
            if grad is not None:
                with torch.no_grad():
                    converted_grad = fn(grad)
                if converted_grad is not grad:
                    grad.data = converted_grad
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    patches.set(torch.nn.Module, "_apply", _apply)


def _apply_plain(module: torch.nn.Module, original: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """A module without fake tensors of its own (its children were converted already): PyTorch's."""
    return original(module, fn, recurse=False)
