"""The agent's pair of global module forward hooks, lifted inside a light step's top-level forward.

Any global module hook sends every module call of the process down ``Module._call_impl``'s slow
path (about 1.7 us a module on a 2-core CPU, ``bench/module_hooks.py``), and the agent's own pair
adds its Python on top: a cost per module per step that grew with the model (a 5001-module model
paid it 10,000 times a step). Outside the deep and block-timed steps nothing needs a module's
event below the top level: the agent's phases, its model discovery and its step boundaries read
the top-level forward only (``Agent.forward_pre`` says which call that is). So at a top-level
forward with children, while no probe subscribes to module events, the pair is taken off for
the forward's length: the module's calls inside take the fast path. One forward hook on the
top-level module itself (``always_call``, so an exception ends it too) sees the forward end and
puts the pair back; it is removed at once, so nothing of the agent is left on the script's
module between its forwards (a ``torch.save(model)`` or a ``copy.deepcopy`` would carry it).
A backward lifts it as well (``lift_for_backward``): the agent reads no forward inside one, and a
checkpoint's recomputation would otherwise pay per module what its lifted forward did not (the
zoo's hf_clm and fsdp2 kept checkpointing 14% and 23% slower than predicted before it did).
A block-timed step lifts the pair too: its timer subscribes to the blocks it times only
(``ModuleEvents.subscribe(..., modules)``), which get the pair's calls through hooks of their own
for the forward's length, so a block's time is what it costs on a light step, without the
per-module hook cost inside it. Deep steps, whose probes follow every module, keep the pair.

``torch.compile`` guards on the global hook dicts: a compiled region traced with the pair and
called without it (or the reverse) is compiled again (checked on torch 2.13: two graphs for
one). So the pair stays on for good from the first ``torch.compile`` call (wrapped here, before
dynamo traces anything) or the first frame dynamo compiled (``counters``, for code that reached
dynamo another way), as it was before this lifting existed.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator

import torch
from torch.nn.modules import module as nn_module

PreHook = Callable[[torch.nn.Module, Any], None]
PostHook = Callable[[torch.nn.Module, Any, Any], None]


def dynamo_compiled() -> bool:
    """Whether dynamo has looked at any frame in this process (without importing it)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None) if utils is not None else None
    return bool(counters and counters.get("frames", {}).get("total"))


_CALL_IMPL = torch.nn.Module._call_impl.__code__


def _running(module: torch.nn.Module | None) -> bool:
    """Whether ``module``'s call is on this thread's stack (a frame walk: rare paths only)."""
    frame = sys._getframe(1)
    while frame is not None and module is not None:
        if frame.f_code is _CALL_IMPL and frame.f_locals.get("self") is module:
            return True
        frame = frame.f_back
    return False


class ForwardHooks:
    """The global forward pre-hook and forward hook (``always_call``) of the agent, and their lifting."""

    def __init__(self, pre: PreHook, post: PostHook) -> None:
        self._pre, self._post = pre, post
        self._handles: list[Any] = []
        self._lifted: Any = None  # the top-level module's own forward hook while the pair is off
        self._top: torch.nn.Module | None = None  # and that module
        self._scoped: list[Any] = []  # the scoped subscribers' modules' hooks while the pair is off
        self.liftable = not dynamo_compiled()  # False for good once anything is compiled

    def install(self, add_undo: Callable[[Callable[[], None]], None]) -> None:
        self._register()
        original = torch.compile

        @functools.wraps(original)
        def compile(*args: Any, **kwargs: Any) -> Any:
            self.liftable = False  # before dynamo traces anything: the pair stays on
            self.restore(force=True)  # inside a lifted forward too (a kernel compiled at first use)
            return original(*args, **kwargs)

        torch.compile = compile  # type: ignore[assignment]
        add_undo(lambda: setattr(torch, "compile", original))
        original_save = torch.save

        @functools.wraps(original_save)
        def save(*args: Any, **kwargs: Any) -> Any:
            self.restore()  # a model saved whole after an interrupt in its forward: no hook of ours in it
            return original_save(*args, **kwargs)

        torch.save = save  # type: ignore[assignment]
        add_undo(lambda: setattr(torch, "save", original_save))
        add_undo(self.remove)

    def remove(self) -> None:
        self._drop_lifted()
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _register(self) -> None:
        self._handles = [nn_module.register_module_forward_pre_hook(self._pre),
                         nn_module.register_module_forward_hook(self._post, always_call=True)]

    def lift(self, module: torch.nn.Module, scoped: list[torch.nn.Module] = ()) -> None:  # type: ignore[assignment]
        """``module``'s top-level forward starts (the pre-hook's call): take the pair off until it
        ends. ``scoped``: the modules a scoped subscriber follows (a block-timed step's blocks),
        which get the pair's calls through hooks of their own for the forward's length. The
        caller checks that no subscriber follows every module."""
        self._drop_lifted()  # one an exception left behind (the pair is on: this is its pre-hook)
        if not self.liftable or not self._handles or not module._modules:
            return  # a leaf (a loss module) saves nothing; compiled code must see one state
        if dynamo_compiled():
            self.liftable = False
            return
        # First among its forward hooks, where the global one ran (before FSDP's post-forward work).
        self._lifted = module.register_forward_hook(self._forward_ended, prepend=True, always_call=True)
        self._top = module
        for inner in scoped:
            if inner is not module:  # first among its hooks, as the global pair's calls come
                self._scoped += [inner.register_forward_pre_hook(self._pre, prepend=True),
                                 inner.register_forward_hook(self._post, prepend=True, always_call=True)]
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _forward_ended(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._post(module, args, output)
        self._drop_scoped()
        if sys.exc_info()[0] is None:
            # ``_call_impl`` calls forward hooks from a copy of its dict: removing this one is safe.
            # On an exception it iterates the live dict: the next ``restore`` removes it.
            self._drop_lifted()
        if not self._handles:
            self._register()

    def lift_for_backward(self) -> bool:
        """Take the pair off for a backward (the agent reads no forward inside one: a checkpoint's
        recomputation would otherwise pay the per-module cost its forward, lifted, did not);
        True when taken off, and ``end_backward`` puts it back. The caller checks that no
        subscriber follows every module."""
        if not self.liftable or not self._handles or self._lifted is not None:
            return False
        if dynamo_compiled():
            self.liftable = False
            return False
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return True

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """The pair off for the agent's own forwards and backwards between steps (a checkpoint
        trial's copy of a block), which then run as a light step runs them; as it was after."""
        lifted = self.lift_for_backward()
        try:
            yield
        finally:
            if lifted:
                self.end_backward()

    def end_backward(self) -> None:
        if not self._handles and self._lifted is None:
            self._register()

    def restore(self, *, force: bool = False) -> None:
        """The pair back on, if a forward left it off (an interrupt skips the always-called hooks),
        unless that forward is still running (a backward inside a module's forward) and not
        ``force``. Back on inside a forward is safe: the modules it entered took the fast path,
        which runs no post-hook, and the top-level module's ends through the global one."""
        if self._lifted is not None and (force or not _running(self._top)):
            self._drop_lifted()
            if not self._handles:
                self._register()

    def _drop_lifted(self) -> None:
        self._drop_scoped()
        self._top = None
        lifted, self._lifted = self._lifted, None
        if lifted is not None:
            lifted.remove()

    def _drop_scoped(self) -> None:
        scoped, self._scoped = self._scoped, []
        for handle in scoped:
            handle.remove()

    @property
    def lifted(self) -> bool:
        return self._lifted is not None and not self._handles
