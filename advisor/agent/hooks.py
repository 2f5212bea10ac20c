"""Global hooks that feed the agent, installed before the user's script runs.

Uses only public global-hook APIs (PYTORCH-NOTES: they fire under runpy and
torchrun) plus wrappers: ``torch.autograd.backward`` (``Tensor.backward``
calls it, so one wrapper sees both spellings and the tensor the loss is),
``DataLoader``'s iterator ``__next__`` (to time data waits precisely),
``GradScaler.scale`` (to record the unscaled loss), the constructors in ``advisor.agent.capture``
and the ``zero_grad`` of modules and optimizers (a step boundary in loops without an optimizer).
The module forward pair is lifted inside a light step's top-level forward
(``advisor/agent/forward_hooks.py``): only the deep and block-timed steps pay per module.

Every hook returns at once while dynamo traces (``torch.compiler.is_compiling()``): the
body is then a constant no-op for dynamo, so a compiled model gets no graph break and no
recompile from us (tests/test_compile_hooks.py counts them against a bare run). Checked on
torch 2.13: plain hooks gave 3 graphs for 1; ``torch.compiler.disable`` on the hooks makes
dynamo skip them with a graph break at the hooked call instead.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import torch
import torch.autograd
from torch.optim import optimizer as optim_module
from torch.utils.data import dataloader

from advisor.agent.agent import Agent
from advisor.agent.forward_hooks import ForwardHooks
from advisor.records.samples import BOUNDARY_SPAN


class InstalledHooks:
    """Handles to remove every hook and restore every wrapped function."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def add(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()


def install(agent: Agent) -> InstalledHooks:
    hooks = InstalledHooks()
    hooks.add(agent.boundaries.stop_timing)  # undone last: a timed step's saved-tensor hooks come off too
    hooks.add(agent.deep.gc_pace.restore)  # a deep step cut short (an exception, a session's end): the script's pace

    compiling = torch.compiler.is_compiling

    events = agent.module_events  # the probes' deep-step subscribers: one hook pair serves all
    subscribed = events.subscribers  # (tested as a list: no call per module while nobody subscribes)

    def fwd_pre(module: torch.nn.Module, args: Any) -> None:
        if not compiling():
            if agent.forward_pre(module) and not events.everywhere:
                # a light step's top-level forward: its modules' calls unhooked (a timed one's blocks kept)
                forward.lift(module, events.scoped_modules() if subscribed else ())
            if subscribed:
                events.pre(module, args)

    def fwd_post(module: torch.nn.Module, args: Any, output: Any) -> None:
        if not compiling():
            agent.forward_post(module)
            if subscribed:
                events.post(module, args, output)

    def boundary_work(call: Callable[[torch.optim.Optimizer], None], optimizer: torch.optim.Optimizer) -> None:
        if compiling():
            return
        if torch.autograd._profiler_enabled() and not agent.deep.active:
            # The script profiles itself: the agent's own work at the step boundary (inside the
            # trace's Optimizer.step span) is marked, so an imported trace leaves it out as the
            # agent's session does (advisor/importers/kineto.py).
            with torch.profiler.record_function(BOUNDARY_SPAN):
                call(optimizer)
            return
        call(optimizer)

    def opt_pre(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not compiling():  # (a compiled step traces this hook: nothing of ours for dynamo to guard on)
            forward.restore()
        boundary_work(agent.optimizer_pre, optimizer)

    def opt_post(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        boundary_work(agent.optimizer_post, optimizer)

    forward = ForwardHooks(fwd_pre, fwd_post)
    forward.install(hooks.add)
    agent.hooks_aside = forward.aside
    hooks.add(lambda: setattr(agent, "hooks_aside", None))
    for handle in (
        optim_module.register_optimizer_step_pre_hook(opt_pre),
        optim_module.register_optimizer_step_post_hook(opt_post),
    ):
        hooks.add(handle.remove)

    # Optimizers, LR schedulers and DDP/FSDP wrappers are captured when built (remedies act on them).
    agent.install(hooks.add)

    for owner in (torch.nn.Module, torch.optim.Optimizer):
        _wrap_zero_grad(owner, agent, hooks)

    original_backward = torch.autograd.backward

    @functools.wraps(original_backward)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if compiling() or torch._C._current_graph_task_id() != -1:  # a backward inside backward
            return original_backward(tensors, *args, **kwargs)
        forward.restore()
        agent.backward_start(tensors)
        lifted = not events.everywhere and forward.lift_for_backward()  # recomputations unhooked
        try:
            return original_backward(tensors, *args, **kwargs)
        finally:
            if lifted:
                forward.end_backward()
            agent.backward_end()

    torch.autograd.backward = backward
    hooks.add(lambda: setattr(torch.autograd, "backward", original_backward))

    # Under mixed precision the script calls backward on GradScaler.scale(loss): remember
    # which loss a scaled tensor came from, so the step records the loss, not loss * scale.
    scaler_cls = torch.amp.grad_scaler.GradScaler
    original_scale = scaler_cls.scale

    @functools.wraps(original_scale)
    def scale(self: Any, outputs: Any) -> Any:
        scaled = original_scale(self, outputs)
        agent.loss_scaled(scaled, outputs)
        return scaled

    scaler_cls.scale = scale  # type: ignore[method-assign]
    hooks.add(lambda: setattr(scaler_cls, "scale", original_scale))

    # Ctrl-C during a deep step often lands in a storage finalizer or a __del__, where Python
    # ignores exceptions (sys.unraisablehook) and training would go on: note it, and the agent
    # raises KeyboardInterrupt at its next hook, in the script's own frames.
    previous_unraisable = sys.unraisablehook

    def on_unraisable(args: Any) -> None:
        if args.exc_type is not None and issubclass(args.exc_type, KeyboardInterrupt):
            agent.interrupt_pending = True
            return
        previous_unraisable(args)

    sys.unraisablehook = on_unraisable
    hooks.add(lambda: setattr(sys, "unraisablehook", previous_unraisable))

    iter_cls = dataloader._BaseDataLoaderIter
    original_next = iter_cls.__next__

    @functools.wraps(original_next)
    def next_batch(self: Any) -> Any:
        forward.restore()
        previous = agent.data_start(self)
        try:
            return original_next(self)
        finally:
            agent.data_end(previous)

    iter_cls.__next__ = next_batch  # type: ignore[method-assign]
    hooks.add(lambda: setattr(iter_cls, "__next__", original_next))
    return hooks



def _wrap_zero_grad(owner: type, agent: Agent, hooks: InstalledHooks) -> None:
    original = owner.zero_grad  # type: ignore[attr-defined]

    @functools.wraps(original)
    def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():
            agent.zero_grad_called()
        return original(self, *args, **kwargs)

    owner.zero_grad = zero_grad  # type: ignore[attr-defined]
    hooks.add(lambda: setattr(owner, "zero_grad", original))
