"""The probes' saved-tensor hooks step aside for ``torch.func`` (issue 30: a script's per-sample
gradients died under attach).

The memory tracker (deep steps) and the block timer (block-timed light steps) push
``torch.autograd.graph.saved_tensors_hooks`` for a whole step. ``torch.func.grad``, ``vjp``,
``jacrev`` and ``hessian`` refuse to run under any such hooks: each enters
``torch.autograd.graph.disable_saved_tensors_hooks``, whose
``torch._C._autograd._saved_tensors_hooks_disable`` raises "torch.func.{grad, vjp, jacrev, hessian}
don't yet support saved tensor hooks" when the hooks' stack is not empty. A script that calls
them (per-sample gradient norms, a Jacobian penalty, MAML) ran under python and died under attach
at its first deep step.

``push`` and ``pop`` put the probes' hooks on and off the stack through this module. While it has
any pushed, the two C entry points that disable and re-enable the hooks are wrapped: a disable
that finds the probes' hooks on top of this thread's stack takes them off first, and the enable
that ends that disabled region puts them back. What autograd saves inside the transform is then
not seen by the probes (its tensors live only inside the transform's own autograd levels). Hooks
of the script's own stay where they are, so a disable under them raises as under python. Nothing
is wrapped while the probes have no hooks pushed. The wrapped names are private (torch 2.11 and
2.13 both call them from ``disable_saved_tensors_hooks``); where they are missing nothing is
wrapped and the transform raises as it did.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_C = torch._C._autograd
_local = threading.local()  # .pushed: the probes' hooks on this thread's stack; .aside: groups taken off
_lock = threading.Lock()
_originals: tuple[Any, Any] | None = None  # (disable, enable) while wrapped
_pushed_anywhere = 0


def push(hooks: Any) -> None:
    """Enter ``hooks`` (a ``saved_tensors_hooks``) on this thread, as ``hooks.__enter__()``; raises
    what that raises (the script disabled saved-tensor hooks) and then holds nothing."""
    global _pushed_anywhere
    hooks.__enter__()
    _state().pushed.append(hooks)
    with _lock:
        _pushed_anywhere += 1
        _wrap()


def pop(hooks: Any) -> None:
    """Leave ``hooks`` on this thread: off the stack, or, while a ``torch.func`` transform has
    them aside, only forgotten (they are not on the stack to pop)."""
    global _pushed_anywhere
    state = _state()
    if hooks in state.pushed:
        state.pushed.remove(hooks)
    else:
        return
    aside = next((group for group in state.aside if hooks in group), None)
    if aside is not None:
        aside.remove(hooks)
    else:
        hooks.__exit__(None, None, None)
    if not state.pushed:
        state.aside.clear()  # a group emptied inside a transform: its enable may no longer be wrapped
    with _lock:
        _pushed_anywhere -= 1
        if _pushed_anywhere == 0:
            _unwrap()


def _state() -> threading.local:
    if not hasattr(_local, "pushed"):
        _local.pushed, _local.aside = [], []
    return _local


def _wrap() -> None:
    global _originals
    if _originals is not None:
        return
    disable = getattr(_C, "_saved_tensors_hooks_disable", None)
    enable = getattr(_C, "_saved_tensors_hooks_enable", None)
    if disable is None or enable is None or not hasattr(_C, "_top_saved_tensors_default_hooks") \
            or not hasattr(_C, "_saved_tensors_hooks_is_enabled"):
        return
    _originals = (disable, enable)
    _C._saved_tensors_hooks_disable = _disable
    _C._saved_tensors_hooks_enable = _enable


def _unwrap() -> None:
    global _originals
    if _originals is None:
        return
    _C._saved_tensors_hooks_disable, _C._saved_tensors_hooks_enable = _originals
    _originals = None


def _ours_on_top(state: threading.local) -> Any:
    top = _C._top_saved_tensors_default_hooks(False)
    if top is None:
        return None
    return next((h for h in state.pushed if h.pack_hook is top[0] and h.unpack_hook is top[1]), None)


def _disable(message: str) -> None:
    """``_saved_tensors_hooks_disable``, with the probes' hooks taken off the top of this thread's
    stack first when the hooks are enabled (the start of a disabled region)."""
    originals = _originals
    assert originals is not None
    state = _state()
    group: list[Any] = []
    if state.pushed and _C._saved_tensors_hooks_is_enabled():
        while (hooks := _ours_on_top(state)) is not None and hooks not in group:
            hooks.__exit__(None, None, None)
            group.append(hooks)
    try:
        originals[0](message)
    except BaseException:
        for hooks in reversed(group):  # the script's own hooks are under them: as under python
            hooks.__enter__()
        raise
    if group:
        state.aside.append(group)


def _enable() -> None:
    """``_saved_tensors_hooks_enable``, then the hooks the matching disable took off, back on."""
    originals = _originals
    if originals is None:  # unwrapped inside a disabled region: the call still has to reach torch
        _C._saved_tensors_hooks_enable()
        return
    originals[1]()
    state = _state()
    if state.aside:
        for hooks in reversed(state.aside.pop()):
            hooks.__enter__()
