"""Which module is running, forward and backward, during a counted step.

Forward: global module forward pre/post hooks keep a stack of names.
Backward: by autograd node. After a module's forward its post hook tags the
autograd nodes that forward created with the module's name
(advisor.probes.module_nodes); in backward an op belongs to the module that
created the node running it (``torch._C._current_autograd_node()``). Hooks on
tensors cannot do this: a module that returns its input unchanged
(``Dropout(p=0)``, an in-place activation) shares a tensor with its
neighbour, and the neighbour's backward would be credited to it (issue 21,
item 3). Ops of nodes no module created (a loss computed in the script,
gradient accumulation into ``.grad``) go to "".
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from advisor.probes.module_events import Unsubscribe, subscribe_module_events
from advisor.probes.module_nodes import input_nodes, running_module, tag_created_nodes


class ModuleTracker:
    """Innermost module name now; names come from ``name_of`` (the agent's ``module_name``)."""

    def __init__(self, name_of: Callable[[torch.nn.Module], str | None]) -> None:
        self._name_of = name_of
        self._names: dict[int, str | None] = {}
        self._forward: list[tuple[str, set[Any]]] = []
        self._unsubscribe: Unsubscribe | None = None

    def _name(self, module: torch.nn.Module) -> str | None:
        key = id(module)
        if key not in self._names:
            self._names[key] = self._name_of(module)
        return self._names[key]

    def start(self, ctx: Any = None) -> None:
        """Follow module forwards through ``ctx``'s module events (the agent's one hook set),
        or through global hooks of our own when it has none."""
        self._unsubscribe = subscribe_module_events(ctx, self._pre, self._post)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._forward.clear()
        self._names.clear()

    def end_backward(self) -> None:
        """Kept for callers of the tensor-hook tracker; nothing stays open between phases now."""

    def current(self, backward: bool) -> str:
        if backward:
            running = running_module()
            if running is not None:
                return running
            # Recomputation under checkpointing runs forward hooks inside backward.
            return self._forward[-1][0] if self._forward else ""
        return self._forward[-1][0] if self._forward else ""

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        name = self._name(module)
        if name is None:
            return
        self._forward.append((name, input_nodes(args)))

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self._name(module)
        if name is None or not self._forward or self._forward[-1][0] != name:
            return
        _, stop_nodes = self._forward.pop()
        tag_created_nodes(output, name, stop_nodes)
