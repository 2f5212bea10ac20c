"""Global hooks that feed the agent, installed before the user's script runs.

Uses only public global-hook APIs (PYTORCH-NOTES: they fire under runpy and
torchrun) plus wrappers: ``torch.autograd.backward`` (``Tensor.backward``
calls it, so one wrapper sees both spellings and the tensor the loss is),
``DataLoader``'s iterator ``__next__`` (to time data waits precisely),
``GradScaler.scale`` (to record the unscaled loss) and the constructors in
``advisor.agent.capture``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.autograd
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils.data import dataloader

from advisor.agent.agent import Agent


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

    def fwd_pre(module: torch.nn.Module, args: Any) -> None:
        agent.forward_pre(module)

    def fwd_post(module: torch.nn.Module, args: Any, output: Any) -> None:
        agent.forward_post(module)

    for handle in (
        nn_module.register_module_forward_pre_hook(fwd_pre),
        nn_module.register_module_forward_hook(fwd_post, always_call=True),
        optim_module.register_optimizer_step_pre_hook(lambda opt, a, k: agent.optimizer_pre(opt)),
        optim_module.register_optimizer_step_post_hook(lambda opt, a, k: agent.optimizer_post(opt)),
    ):
        hooks.add(handle.remove)

    # Optimizers, LR schedulers and DDP/FSDP wrappers are captured when built (remedies act on them).
    agent.capture.install(agent, hooks.add)

    original_backward = torch.autograd.backward

    @functools.wraps(original_backward)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if torch._C._current_graph_task_id() != -1:  # a backward inside backward
            return original_backward(tensors, *args, **kwargs)
        agent.backward_start(tensors)
        try:
            return original_backward(tensors, *args, **kwargs)
        finally:
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

    iter_cls = dataloader._BaseDataLoaderIter
    original_next = iter_cls.__next__

    @functools.wraps(original_next)
    def next_batch(self: Any) -> Any:
        previous = agent.data_start()
        try:
            return original_next(self)
        finally:
            agent.data_end(previous)

    iter_cls.__next__ = next_batch  # type: ignore[method-assign]
    hooks.add(lambda: setattr(iter_cls, "__next__", original_next))
    return hooks
