"""Which module is running, forward and backward, during a counted step.

Forward: global module forward pre/post hooks keep a stack of names.
Backward: on each module's outputs a multi-grad hook (mode "any") marks the
start of its backward, and on its inputs one marks the end, the way
``torch.utils.module_tracker.ModuleTracker`` does. A module whose inputs need no
gradient (the first layer) stays open until the backward ends; the innermost
(deepest) open module wins, so this only affects ops of no other module.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_flatten


def _grad_tensors(value: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]


class ModuleTracker:
    """Innermost module name now; names come from ``name_of`` (the agent's ``module_name``)."""

    def __init__(self, name_of: Callable[[torch.nn.Module], str | None]) -> None:
        self._name_of = name_of
        self._names: dict[int, str | None] = {}
        self._forward: list[str] = []
        self._backward: dict[str, int] = {}  # open module name -> open count
        self._handles: list[Any] = []

    def _name(self, module: torch.nn.Module) -> str | None:
        key = id(module)
        if key not in self._names:
            self._names[key] = self._name_of(module)
        return self._names[key]

    def start(self) -> None:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._pre),
            hooks.register_module_forward_hook(self._post),
        ]

    def stop(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._forward.clear()
        self._backward.clear()
        self._names.clear()

    def end_backward(self) -> None:
        """Close modules whose input-gradient hooks never fired."""
        self._backward.clear()

    def current(self, backward: bool) -> str:
        if backward and self._backward:
            return max(self._backward, key=lambda n: (0 if n == "" else n.count(".") + 1))
        return self._forward[-1] if self._forward else ""

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        name = self._name(module)
        if name is None:
            return
        self._forward.append(name)
        inputs = _grad_tensors(args)
        if inputs:
            register_multi_grad_hook(inputs, lambda _g, n=name: self._close(n), mode="any")

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self._name(module)
        if name is None:
            return
        if self._forward and self._forward[-1] == name:
            self._forward.pop()
        outputs = _grad_tensors(output)
        if outputs:
            register_multi_grad_hook(outputs, lambda _g, n=name: self._open(n), mode="any")

    def _open(self, name: str) -> None:
        self._backward[name] = self._backward.get(name, 0) + 1

    def _close(self, name: str) -> None:
        count = self._backward.get(name, 0) - 1
        if count > 0:
            self._backward[name] = count
        else:
            self._backward.pop(name, None)
