"""Capture the objects a remedy may need to act on, when the script constructs them.

Intercepts the constructors of ``torch.optim.Optimizer``, ``torch.optim.lr_scheduler.LRScheduler``
(``_LRScheduler`` is an alias), ``DistributedDataParallel`` and the legacy
``FullyShardedDataParallel``. The script keeps its own references; we keep weak ones, so a
remedy can change those very objects in place (a fused optimizer, a retargeted scheduler) and the
user's loop steps what was changed. ``target()`` hands them to the apply executor as an
``advisor.apply.target.Target``.
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from advisor.apply.target import Target

if TYPE_CHECKING:  # pragma: no cover
    from advisor.agent.agent import Agent


class Capture:
    """Weak references to what the script built, in construction order."""

    def __init__(self) -> None:
        self._optimizers: list[weakref.ref] = []
        self._schedulers: list[weakref.ref] = []
        self._wrappers: list[weakref.ref] = []

    @staticmethod
    def _alive(refs: list[weakref.ref]) -> list[Any]:
        return [o for ref in refs if (o := ref()) is not None]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self._alive(self._optimizers)

    def lr_schedulers(self) -> list[Any]:
        return self._alive(self._schedulers)

    def wrappers(self) -> list[torch.nn.Module]:
        return self._alive(self._wrappers)

    def _add(self, refs: list[weakref.ref], obj: Any) -> None:
        if not any(ref() is obj for ref in refs):
            refs.append(weakref.ref(obj))

    def install(self, agent: "Agent", add_undo: Callable[[Callable[[], None]], None]) -> None:
        """Wrap the constructors; ``add_undo`` receives what restores each one."""

        def on_optimizer(opt: Any) -> None:
            self._add(self._optimizers, opt)
            # Discovered when built, so a job that fails before its first step (an OOM in
            # step 0) still says which optimizer it would have run.
            agent.optimizer_created(opt)

        classes: list[tuple[type, Callable[[Any], None]]] = [
            (torch.optim.Optimizer, on_optimizer),
            (torch.optim.lr_scheduler.LRScheduler, lambda s: self._add(self._schedulers, s)),
            (torch.nn.parallel.DistributedDataParallel, lambda w: self._add(self._wrappers, w)),
        ]
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel

            classes.append((FullyShardedDataParallel, lambda w: self._add(self._wrappers, w)))
        except ImportError:  # pragma: no cover - torch without distributed
            pass
        for cls, callback in classes:
            _wrap_init(cls, callback, add_undo)

    def target(self, agent: "Agent") -> Target:
        """The live objects, for ``apply_<remedy>(target, ...)``."""
        optimizers = self.optimizers()
        for opt in agent.optimizers():  # one built before the hooks (rare) is still known once it steps
            if not any(o is opt for o in optimizers):
                optimizers.append(opt)
        wrappers = self.wrappers()
        group = None
        for wrapper in wrappers:
            group = getattr(wrapper, "process_group", None)
            if group is not None:
                break
        if group is None and dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
        return Target(wrapped_models=agent.wrapped_models(), optimizers=optimizers,
                      lr_schedulers=self.lr_schedulers(), wrappers=wrappers, process_group=group,
                      device=agent.device, rank=agent.rank, world_size=agent.world_size)


def _wrap_init(cls: type, callback: Callable[[Any], None], add_undo: Callable[[Callable[[], None]], None]) -> None:
    original = cls.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            callback(self)
        except Exception:  # capturing must never break the script's construction
            pass

    cls.__init__ = init  # type: ignore[method-assign]
    add_undo(lambda: setattr(cls, "__init__", original))
