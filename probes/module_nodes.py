"""Which module's forward created an autograd node: the tag both probes attribute backward by.

A module's backward is the backward of the autograd nodes its forward created. Hooks on the
tensors a module returns cannot say that: a module that returns its input unchanged
(``Dropout(p=0)`` on CPU, ``Identity``) shares that tensor with the next module, so the hooks of
both sit on one tensor and the closing hook can fire before the opening one (issue 21, item 3).
Nodes are unambiguous: after a module's forward, every node reachable from its outputs and not
reachable through its inputs' nodes was created inside it. ``tag_created_nodes`` writes the
module's name into those nodes' ``metadata`` (innermost module wins: submodules tag theirs
first); in backward ``torch._C._current_autograd_node()`` names the node running the op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

TAG = "advisor.module"


def _tensors(value: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def input_nodes(args: Any) -> set[Any]:
    """The autograd nodes of a forward's inputs: where the walk from its outputs stops."""
    return {t.grad_fn for t in _tensors(args) if t.grad_fn is not None}


def tag_created_nodes(output: Any, name: str, stop_nodes: set[Any]) -> None:
    """Tag the nodes ``name``'s forward created (see the module docstring).

    Stops at the inputs' nodes and at nodes tagged by a module that is not inside this one
    (another module's graph: everything upstream of it is outside this module too).
    """
    prefix = name + "."
    todo = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
    seen: list[Any] = []  # keeps the Python wrappers alive so ids stay unique
    seen_ids: set[int] = set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen_ids or node in stop_nodes:
            continue
        seen.append(node)
        seen_ids.add(id(node))
        if type(node).__name__ == "AccumulateGrad":
            continue
        try:
            meta = node.metadata
        except Exception:  # a node type without metadata support
            continue
        tag = meta.get(TAG)
        if tag is None:
            meta[TAG] = name
        elif name and tag != name and not tag.startswith(prefix):
            continue
        todo.extend(next_node for next_node, _ in node.next_functions)


def node_module(node: Any) -> str | None:
    """The module name tagged on ``node`` (an autograd node), or None."""
    if node is None:
        return None
    try:
        return node.metadata.get(TAG)
    except Exception:  # nodes without metadata support
        return None


def running_module() -> str | None:
    """In backward: the module whose forward created the node now running, or None."""
    return node_module(torch._C._current_autograd_node())
