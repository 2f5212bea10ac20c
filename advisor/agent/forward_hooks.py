"""The agent's pair of global module forward hooks, lifted inside a light step's top-level forward.

Any global module hook sends every module call of the process down ``Module._call_impl``'s slow
path (about 1.7 us a module on a 2-core CPU, ``bench/module_hooks.py``), and the agent's own pair
adds its Python on top: a cost per module per step that grew with the model (a 5001-module model
paid it 10,000 times a step). Outside the deep and block-timed steps nothing needs a module's
event below the top level: the agent's phases, its model discovery and its step boundaries read
the top-level forward only (``Agent.forward_pre`` says which call that is). So at a top-level
forward of a model of ``MIN_MODULES`` or more, while no probe follows every module, the pair is
taken off for the forward's length: the module's calls inside take the fast path. One forward hook on the
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
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.nn.modules import module as nn_module
from torch.utils.hooks import RemovableHandle

PreHook = Callable[[torch.nn.Module, Any], None]
PostHook = Callable[[torch.nn.Module, Any, Any], None]


def dynamo_compiled() -> bool:
    """Whether dynamo has looked at any frame in this process (without importing it)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None) if utils is not None else None
    return bool(counters and counters.get("frames", {}).get("total"))


_CALL_IMPL = torch.nn.Module._call_impl.__code__
MAX_SIZES = 4096  # module counts remembered (by id) before they are read again


def _running(module: torch.nn.Module | None) -> bool:
    """Whether ``module``'s call is on this thread's stack (a frame walk: rare paths only)."""
    frame = sys._getframe(1)
    while frame is not None and module is not None:
        if frame.f_code is _CALL_IMPL and frame.f_locals.get("self") is module:
            return True
        frame = frame.f_back
    return False


class ForwardHooks:
    """The global forward pre-hook and forward hook (``always_call``) of the agent, and their lifting.

    The pair is registered once (``register_module_forward_*``); lifting takes its two entries out
    of PyTorch's global hook dicts and puts them back under the same ids, and the top-level
    module's end hook goes into that module's hook dicts under an id of its own: a handle made
    and removed per step cost 100 us of a 20 ms step in place (``bench/light_step_cost.py``), dict
    operations a few. Nothing is lifted while another global module hook exists: PyTorch's slow
    path would stay on for every module anyway.
    """

    # Below this many modules lifting is not worth its fixed cost. In place on a 0.5 ms step of a
    # 10-module MLP, lifted steps cost 7.5 us less than hooked ones (``python bench/overhead.py
    # --inproc --model mlp --probes none --mlp 32,4,4``: 1.182 against 1.197 of bare, two runs each).
    MIN_MODULES = 8

    def __init__(self, pre: PreHook, post: PostHook) -> None:
        self._pre, self._post = pre, post
        self._sizes: dict[int, int] = {}  # id(module) -> its module count, once read (an id reused: a guess)
        self._backward_too = False  # a top-level forward was lifted since the last backward: it is too
        self._ever_lifted = False  # the job's model is large enough: the agent's own forwards are too
        self._handles: list[Any] = []  # the pair's registration (removed at uninstall)
        self._on = False  # the pair's entries are in the global dicts
        self._end_id = RemovableHandle(OrderedDict()).id  # a hook id no one else holds
        self._top: torch.nn.Module | None = None  # the lifted top-level module: its end hook in place
        self._scoped: list[Any] = []  # the scoped subscribers' modules' hooks while the pair is off
        self.liftable = not dynamo_compiled()  # False for good once anything is compiled

    def install(self, add_undo: Callable[[Callable[[], None]], None]) -> None:
        self._handles = [nn_module.register_module_forward_pre_hook(self._pre),
                         nn_module.register_module_forward_hook(self._post, always_call=True)]
        self._on = True
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
        self._handles, self._on = [], False

    # -- the pair's entries ----------------------------------------------------------------
    def _can_lift(self) -> bool:
        """The pair is on, alone among global module hooks, and nothing was compiled."""
        if not (self.liftable and self._on):
            return False
        if dynamo_compiled():
            self.liftable = False
            return False
        return (len(nn_module._global_forward_pre_hooks) == 1 and len(nn_module._global_forward_hooks) == 1
                and not nn_module._global_backward_hooks and not nn_module._global_backward_pre_hooks)

    def _off(self) -> None:
        pre, post = self._handles
        del nn_module._global_forward_pre_hooks[pre.id], nn_module._global_forward_hooks[post.id]
        self._on = False  # (the post's ``always_call`` entry stays: read only beside its hook)

    def _back_on(self) -> None:
        if not self._on and self._handles:
            pre, post = self._handles
            nn_module._global_forward_pre_hooks[pre.id] = self._pre
            nn_module._global_forward_hooks[post.id] = self._post
            self._on = True

    # -- a top-level forward ---------------------------------------------------------------
    def lift(self, module: torch.nn.Module, scoped: Sequence[torch.nn.Module] = ()) -> None:
        """``module``'s top-level forward starts (the pre-hook's call): take the pair off until it
        ends. ``scoped``: the modules a scoped subscriber follows (a block-timed step's blocks),
        which get the pair's calls through hooks of their own for the forward's length. The
        caller checks that no subscriber follows every module."""
        self._drop_lifted()  # one an exception left behind (the pair is on: this is its pre-hook)
        if not module._modules:
            return  # a leaf (a loss module): nothing inside it to save
        size = self._sizes.get(id(module))
        if size is None:
            if len(self._sizes) >= MAX_SIZES:  # a script building a top-level module every step: bounded
                self._sizes.clear()
            size = self._sizes[id(module)] = sum(1 for _ in module.modules())
        if size < self.MIN_MODULES or not self._can_lift():  # compiled code must see one state
            return
        self._backward_too = self._ever_lifted = True
        # First among its forward hooks, where the global one ran (before FSDP's post-forward work).
        hooks = module._forward_hooks
        hooks[self._end_id] = self._forward_ended
        hooks.move_to_end(self._end_id, last=False)
        module._forward_hooks_always_called[self._end_id] = True
        self._top = module
        for inner in scoped:
            if inner is not module:  # first among its hooks, as the global pair's calls come
                self._scoped += [inner.register_forward_pre_hook(self._pre, prepend=True),
                                 inner.register_forward_hook(self._post, prepend=True, always_call=True)]
        self._off()

    def _forward_ended(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._post(module, args, output)
        self._drop_scoped()
        if sys.exc_info()[0] is None:
            # ``_call_impl`` calls forward hooks from a copy of its dict: removing this one is safe.
            # On an exception it iterates the live dict: the next ``restore`` or lift removes it.
            self._drop_lifted()
        self._back_on()

    # -- a backward, the agent's own work --------------------------------------------------
    def lift_for_backward(self) -> bool:
        """Take the pair off for a backward (the agent reads no forward inside one: a checkpoint's
        recomputation would otherwise pay the per-module cost its forward, lifted, did not);
        True when taken off, and ``end_backward`` puts it back. The caller checks that no
        subscriber follows every module."""
        lifted_forward, self._backward_too = self._backward_too, False
        if not lifted_forward:
            return False  # its forward ran with the pair: so does a recomputation in it
        return self._lift_now()

    def _lift_now(self) -> bool:
        if self._top is not None or not self._can_lift():
            return False
        self._off()
        return True

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """The pair off for the agent's own forwards and backwards between steps (a checkpoint
        trial's copy of a block), which then run as the light step they price runs them; as it
        was after."""
        lifted = self._ever_lifted and self._lift_now()
        try:
            yield
        finally:
            if lifted:
                self.end_backward()

    def end_backward(self) -> None:
        if self._top is None:
            self._back_on()

    def restore(self, *, force: bool = False) -> None:
        """The pair back on, if a forward left it off (an interrupt skips the always-called hooks),
        unless that forward is still running (a backward inside a module's forward) and not
        ``force``. Back on inside a forward is safe: the modules it entered took the fast path,
        which runs no post-hook, and the top-level module's ends through the global one."""
        if self._top is not None and (force or not _running(self._top)):
            self._drop_lifted()
            self._back_on()

    def _drop_lifted(self) -> None:
        self._drop_scoped()
        top, self._top = self._top, None
        if top is not None:
            top._forward_hooks.pop(self._end_id, None)
            top._forward_hooks_always_called.pop(self._end_id, None)

    def _drop_scoped(self) -> None:
        scoped, self._scoped = self._scoped, []
        for handle in scoped:
            handle.remove()
