"""One set of global module forward hooks for every probe.

Each global module hook is Python work on every module call of the user's model, so the agent
installs one pair and fans its events out (issue 9, item 6; issue 14, item 3). A probe
subscribes through its context (``AgentContext.subscribe_module_events``) for the deep steps
only; a context without that method (a test's hand-driven context, an older agent) gets the
probe's own pair of global hooks instead, with the same behaviour.

The agent's side, in its global hooks: ``events.pre(module, args)`` after its own forward
pre-hook work and ``events.post(module, args, output)`` after its own forward hook work (so
module names are known before a probe asks), with ``subscribe_module_events`` returning
``events.subscribe(pre, post)``.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

import torch

PreHook = Callable[[torch.nn.Module, Any], None]
PostHook = Callable[[torch.nn.Module, Any, Any], None]
Unsubscribe = Callable[[], None]


class ModuleEvents:
    """Subscribers to module forward events, called in subscription order."""

    def __init__(self) -> None:
        # The one list, changed in place: the agent's hooks test it directly on every module call
        # (a ``__bool__`` call there was Python work per module of every light step).
        self.subscribers: list[tuple[PreHook, PostHook]] = []
        self.everywhere = 0  # subscribers that follow every module (the deep probes)
        self._scopes: dict[int, list[weakref.ref]] = {}  # id(entry) -> the modules a scoped one follows

    def subscribe(self, pre: PreHook, post: PostHook, modules: Iterable[torch.nn.Module] | None = None) -> Unsubscribe:
        """``pre`` and ``post`` on module forwards until the returned function is called: every
        module's, or (``modules``) at least those modules' and the top-level module's, which lets
        the agent's hooks lift the global pair for the rest (``advisor/agent/forward_hooks.py``).
        A scoped subscriber may see other modules' events too (another's scope): it filters."""
        entry = (pre, post)
        self.subscribers.append(entry)
        if modules is None:
            self.everywhere += 1
        else:
            self._scopes[id(entry)] = [weakref.ref(m) for m in modules]

        def unsubscribe() -> None:
            try:
                self.subscribers.remove(entry)
            except ValueError:  # already removed
                return
            if self._scopes.pop(id(entry), None) is None:
                self.everywhere -= 1

        return unsubscribe

    def scoped_modules(self) -> list[torch.nn.Module]:
        """The modules the scoped subscribers follow (alive, each once)."""
        out: dict[int, torch.nn.Module] = {}
        for refs in self._scopes.values():
            for ref in refs:
                if (module := ref()) is not None:
                    out[id(module)] = module
        return list(out.values())

    def __bool__(self) -> bool:
        return bool(self.subscribers)

    def pre(self, module: torch.nn.Module, args: Any) -> None:
        for pre, _ in tuple(self.subscribers):
            pre(module, args)

    def post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        for _, post in tuple(self.subscribers):
            post(module, args, output)


def subscribe_module_events(ctx: Any, pre: PreHook, post: PostHook) -> Unsubscribe:
    """Receive module forward events through ``ctx`` when it offers them, else through a pair
    of global hooks of our own; returns the function that stops them."""
    subscribe = getattr(ctx, "subscribe_module_events", None) if ctx is not None else None
    if callable(subscribe):
        return subscribe(pre, post)
    hooks = torch.nn.modules.module
    handles = [hooks.register_module_forward_pre_hook(pre), hooks.register_module_forward_hook(post)]

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove
