"""Capture the objects a remedy may need to act on, when the script constructs them.

Intercepts the constructors of ``torch.optim.Optimizer``, ``torch.optim.lr_scheduler.LRScheduler``
(``_LRScheduler`` is an alias), ``DistributedDataParallel`` and the legacy
``FullyShardedDataParallel``, and ``torch.utils.data.DataLoader`` (its construction and each
``iter()``, so the iterator the script's loop holds is known). The script keeps its own
references; we keep weak ones, so a remedy can change those very objects in place (a fused
optimizer, a retargeted scheduler, a DataLoader's workers) and the user's loop steps what was
changed. ``ScriptObjects.target()`` (``advisor/agent/objects.py``) hands them to the apply
executor as an ``advisor.apply.target.Target``. Nothing here knows the agent: what is seen goes
to the callbacks ``install`` is given.

Every DDP object built gets the delegating communication hook (``advisor.apply.comm_switch``) at
construction, because DDP takes one hook per object and gradient compression (``live-opt-in``)
switches it later, once the user consents (``--allow-inexact`` headless, or the TUI's
confirmation: either may come after DDP is built, so the hook cannot wait for it). Until then it
runs DDP's own arithmetic, bit for bit, at any world size. ``AgentSettings.comm_switch`` False
leaves DDP's built-in C++ all-reduce alone (and gradient compression unavailable). A hook the
script registers itself, or one of torch's built-in hooks, becomes the switch's delegate. Each
DataLoader built is reported as an ``Event(name="dataloader")`` (its settings and the host's CPU
count: what the input rule reads).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Iterable

import torch

from advisor.apply import comm_switch
from advisor.apply.loader_settings import loader_settings

AddUndo = Callable[[Callable[[], None]], None]
Notify = Callable[[str, dict[str, Any]], None]  # (event name, data): an event that holds in every regime


class Capture:
    """Weak references to what the script built, in construction order."""

    def __init__(self) -> None:
        self._optimizers: list[weakref.ref] = []
        self._schedulers: list[weakref.ref] = []
        self._wrappers: list[weakref.ref] = []
        self._loaders: list[weakref.ref] = []
        # id(loader) -> (the loader, its latest iterator), both weak: an id is reused once freed
        self._iterators: dict[int, tuple[weakref.ref, weakref.ref]] = {}
        self._adopters: list[tuple[type, Callable[[Any], None]]] = []  # set by ``install``, for ``adopt``

    @staticmethod
    def _alive(refs: list[weakref.ref]) -> list[Any]:
        return [o for ref in refs if (o := ref()) is not None]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self._alive(self._optimizers)

    def lr_schedulers(self) -> list[Any]:
        return self._alive(self._schedulers)

    def wrappers(self) -> list[torch.nn.Module]:
        return self._alive(self._wrappers)

    def dataloaders(self) -> list[Any]:
        return self._alive(self._loaders)

    def running_iterator(self, loader: Any) -> Any:
        refs = self._iterators.get(id(loader))
        if refs is None or refs[0]() is not loader:
            return None
        return refs[1]()

    def _add(self, refs: list[weakref.ref], obj: Any) -> None:
        if not any(ref() is obj for ref in refs):
            refs.append(weakref.ref(obj))

    def install(self, add_undo: AddUndo, *, on_optimizer: Callable[[torch.optim.Optimizer], None],
                notify: Notify, comm_switch_on: bool = True) -> None:
        """Wrap the constructors; ``add_undo`` receives what restores each one. ``on_optimizer``
        hears of each optimizer built (so a job that fails before its first step, an OOM in step
        0, still says which optimizer it would have run); ``notify`` reports each DataLoader's
        settings; ``comm_switch_on`` False leaves DDP's built-in all-reduce alone."""

        def on_optimizer_built(opt: Any) -> None:
            self._add(self._optimizers, opt)
            on_optimizer(opt)

        def on_ddp(wrapper: Any) -> None:
            self._add(self._wrappers, wrapper)
            if comm_switch_on:
                comm_switch.install(wrapper)

        def on_loader(loader: Any) -> None:
            self._add(self._loaders, loader)
            index = next(i for i, ref in enumerate(self._loaders) if ref() is loader)
            notify("dataloader", loader_settings(loader, index))  # holds in every regime until a remedy changes it

        classes: list[tuple[type, Callable[[Any], None]]] = [
            (torch.optim.Optimizer, on_optimizer_built),
            (torch.optim.lr_scheduler.LRScheduler, lambda s: self._add(self._schedulers, s)),
            (torch.nn.parallel.DistributedDataParallel, on_ddp),
            (torch.utils.data.DataLoader, on_loader),
        ]
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel

            classes.append((FullyShardedDataParallel, lambda w: self._add(self._wrappers, w)))
        except ImportError:  # pragma: no cover - torch without distributed
            pass
        for cls, callback in classes:
            _wrap_init(cls, callback, add_undo)
        # Objects built before the hooks get the same callbacks, but a DDP object keeps its own
        # all-reduce: it may have run (or been given a hook) already, and takes one hook ever.
        self._adopters = [(cls, (lambda w: self._add(self._wrappers, w)) if callback is on_ddp else callback)
                          for cls, callback in classes]
        self._wrap_iter(add_undo)
        self._wrap_register_comm_hook(add_undo)

    def adopt(self, objects: Iterable[Any]) -> int:
        """Capture ``objects`` built before ``install`` (an in-process session opened mid-script,
        advisor/api.py) as if seen at construction; how many were captured. DataLoader iterators
        made before are not known (``running_iterator`` is None until the next ``iter()``)."""
        found = 0
        by_type: dict[type, tuple[type, Callable[[Any], None]] | None] = {}  # one issubclass walk per type
        for obj in objects:
            kind = type(obj)  # never isinstance: a proxy's __class__ may run code or raise
            if kind not in by_type:
                by_type[kind] = next(((cls, cb) for cls, cb in self._adopters if issubclass(kind, cls)), None)
            found_as = by_type[kind]
            if found_as is None or (found_as[0] is torch.optim.Optimizer and not _initialised_optimizer(obj)):
                continue
            try:
                found_as[1](obj)
                found += 1
            except Exception:  # capturing must never break the script
                pass
        return found

    def _wrap_iter(self, add_undo: AddUndo) -> None:
        """Remember the iterator each DataLoader hands out (the one the script's loop holds)."""
        cls = torch.utils.data.DataLoader
        original = cls.__iter__
        iterators = self._iterators

        @functools.wraps(original)
        def __iter__(loader: Any) -> Any:
            it = original(loader)
            try:
                iterators[id(loader)] = (weakref.ref(loader), weakref.ref(it))
            except TypeError:  # pragma: no cover - an iterator without weak references
                pass
            return it

        cls.__iter__ = __iter__  # type: ignore[method-assign]
        add_undo(lambda: setattr(cls, "__iter__", original))

    @staticmethod
    def _wrap_register_comm_hook(add_undo: AddUndo) -> None:
        """A hook the script registers on a DDP object that has our switch becomes its delegate."""
        cls = torch.nn.parallel.DistributedDataParallel
        original = cls.register_comm_hook

        @functools.wraps(original)
        def register_comm_hook(ddp: Any, state: object, hook: Callable[..., Any]) -> None:
            switch = getattr(ddp, comm_switch.ATTRIBUTE, None)
            if switch is None or hook is comm_switch.switch_hook:
                return original(ddp, state, hook)
            if switch.user is not None:
                raise RuntimeError("register_comm_hook can only be called once per DDP object")
            switch.user = (state, hook)
            return None

        cls.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
        add_undo(lambda: setattr(cls, "register_comm_hook", original))

        builtin = cls._register_builtin_comm_hook

        @functools.wraps(builtin)
        def _register_builtin_comm_hook(ddp: Any, comm_hook_type: Any) -> None:
            switch = getattr(ddp, comm_switch.ATTRIBUTE, None)
            if switch is None:
                return builtin(ddp, comm_hook_type)
            return register_comm_hook(ddp, switch.process_group, comm_switch.builtin_equivalent(comm_hook_type))

        cls._register_builtin_comm_hook = _register_builtin_comm_hook  # type: ignore[method-assign]
        add_undo(lambda: setattr(cls, "_register_builtin_comm_hook", builtin))


def _initialised_optimizer(obj: Any) -> bool:
    """Whether ``Optimizer.__init__`` ran for ``obj`` (what a capture at construction sees). A
    wrapper that subclasses Optimizer without it (accelerate's ``AcceleratedOptimizer``, which
    delegates to the optimizer it holds) has none of an optimizer's hook tables: it is left out,
    as it is under ``advisor attach``, and the optimizer it holds is captured instead."""
    return "_optimizer_step_pre_hooks" in getattr(obj, "__dict__", {})


def _wrap_init(cls: type, callback: Callable[[Any], None], add_undo: AddUndo) -> None:
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
