"""Watch the script's own checkpointing, for the ZeRO remedy (issue 11).

Under ZeRO each rank's ``optimizer.state_dict()`` holds only its own part of the state (stage
1: the parameters it owns; stages 2 and 3: ``DTensor`` shards), and under stages 2 and 3
``model.state_dict()`` holds ``DTensor`` shards too. A script that writes a checkpoint with
``torch.save`` on one rank would then write a partial one without a word. So the agent wraps
``torch.save`` and torch.distributed.checkpoint's ``save`` and ``async_save`` and, when the
object saved holds the state of a model or optimizer the agent captured, says so once per kind
of save in a ``checkpoint_save`` event (``step`` None: the script's habit holds in every regime;
the step it was first seen at is in the data). The ZeRO predictor reads them
(``recommend/remedies/zero.py``): it refuses the stages such a checkpoint would break.

A save while this remedy has made the saved state partial is warned about every time.

What is recognised, without calling anything of the script's: tensors that share storage
with a captured model's parameters or a captured optimizer's state (``state_dict()`` returns
them or views of them), a dict with ``state`` and ``param_groups`` (an optimizer's state dict,
even an empty one), and, for torch.distributed.checkpoint, a captured model or optimizer
passed as a ``Stateful`` or held in an attribute of one (the tutorials' ``AppState``). The walk
is bounded (depth and items) and runs only when the script saves; nothing is added to a step.

torch.distributed.checkpoint is not imported here (0.6 s at start-up, for scripts that never use
it): a ``sys.meta_path`` finder wraps its ``state_dict_saver`` module's functions as the module
is executed, before the package's ``__init__`` binds them, so ``dcp.save``, ``from
torch.distributed.checkpoint import save`` and ``state_dict_saver.save`` all reach the wrapper.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Any, Callable, Iterator

import torch

from advisor.apply import registry
from advisor.records.checkpoint_saves import partial_state

DCP_SAVER = "torch.distributed.checkpoint.state_dict_saver"
MAX_DEPTH = 6  # a checkpoint dict nests a few levels: {"model": sd, "optim": {"state": {0: {...}}}}
MAX_ITEMS = 200_000  # the walk stops here (a state dict has a few entries per parameter)


def _storage(t: torch.Tensor) -> int:
    """The address of the storage behind ``t`` (a ``DTensor``'s local shard's); 0 when it has none."""
    local = getattr(t, "_local_tensor", None)
    if isinstance(local, torch.Tensor):
        t = local
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # meta, sparse or functional tensors
        return 0


def _is_dtensor(t: torch.Tensor) -> bool:
    return isinstance(getattr(t, "_local_tensor", None), torch.Tensor)


def _walk(obj: Any) -> Iterator[Any]:
    """The containers' leaves and the containers themselves, depth-first and bounded."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    seen = 0
    while stack and seen < MAX_ITEMS:
        item, depth = stack.pop()
        seen += 1
        yield item
        if depth >= MAX_DEPTH:
            continue
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)


def contents(obj: Any, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer],
             *, statefuls: bool) -> tuple[list[str], bool, list[torch.optim.Optimizer]]:
    """What of the captured state ``obj`` holds: (["model"] and/or ["optimizer"], whether a
    saved tensor is a DTensor shard, the optimizers whose state it holds or may hold).
    ``statefuls``: a captured model or optimizer passed as itself counts (DCP calls its
    ``state_dict()``; ``torch.save`` would pickle the whole object)."""
    model_ptrs: set[int] = set()
    model_ids = set()
    for m in models:
        model_ids.add(id(m))
        model_ptrs.update(p for p in map(_storage, m.parameters()) if p)
    opt_ptrs: dict[int, torch.optim.Optimizer] = {}
    for opt in optimizers:
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and (p := _storage(value)):
                    opt_ptrs[p] = opt
    found: set[str] = set()
    sharded = False
    saved_opts: list[torch.optim.Optimizer] = []

    def note_opt(opt: torch.optim.Optimizer) -> None:
        found.add("optimizer")
        if not any(o is opt for o in saved_opts):
            saved_opts.append(opt)

    roots = [obj]
    for item in _walk(obj) if statefuls else ():
        if hasattr(item, "state_dict") and not isinstance(item, (torch.nn.Module, torch.optim.Optimizer)):
            roots.append(dict(getattr(item, "__dict__", {})))  # an AppState holding model and optimizer
    for root in roots:
        for item in _walk(root):
            if isinstance(item, torch.Tensor):
                ptr = _storage(item)
                if ptr in model_ptrs:
                    found.add("model")
                    sharded = sharded or _is_dtensor(item)
                elif ptr in opt_ptrs:
                    note_opt(opt_ptrs[ptr])
                    sharded = sharded or _is_dtensor(item)
            elif isinstance(item, dict) and "state" in item and "param_groups" in item:
                found.add("optimizer")
                if not saved_opts:
                    saved_opts.extend(optimizers)  # which one is not known from an empty state
            elif statefuls and isinstance(item, torch.nn.Module):
                if id(item) in model_ids or any(item is getattr(m, "module", None) for m in models) \
                        or any(getattr(item, "module", None) is m for m in models):
                    found.add("model")
            elif statefuls and isinstance(item, torch.optim.Optimizer):
                if any(item is o for o in optimizers):
                    note_opt(item)
    return sorted(found), sharded, saved_opts


class SaveWatch:
    """The wrappers of ``torch.save`` and DCP's savers. They read the captured models and
    optimizers through ``models`` and ``optimizers``, and report through ``notify(name, data)``
    (an event that holds in every regime) and ``warn(message, **data)``; ``step`` is the step in
    progress."""

    def __init__(self, *, models: Callable[[], list[torch.nn.Module]],
                 optimizers: Callable[[], list[torch.optim.Optimizer]],
                 notify: Callable[[str, dict[str, Any]], None], warn: Callable[..., None],
                 step: Callable[[], int]) -> None:
        self._models, self._optimizers, self._step = models, optimizers, step
        self._notify, self._warn = notify, warn
        self._seen: set[tuple[str, tuple[str, ...], bool]] = set()
        self._inside = threading.local()  # DCP's writer calls torch.save itself: report the outer call

    def install(self, add_undo: Callable[[Callable[[], None]], None]) -> None:
        original = torch.save
        torch.save = self._wrap("torch.save", original)  # type: ignore[assignment]
        add_undo(lambda: setattr(torch, "save", original))
        saver = sys.modules.get(DCP_SAVER)
        if saver is not None:
            self.wrap_saver(saver, add_undo)
            return
        finder = _SaverFinder(lambda module: self.wrap_saver(module, add_undo))
        sys.meta_path.insert(0, finder)
        add_undo(lambda: sys.meta_path.remove(finder) if finder in sys.meta_path else None)

    def wrap_saver(self, module: Any, add_undo: Callable[[Callable[[], None]], None]) -> None:
        for name in ("save", "async_save"):
            original = getattr(module, name, None)
            if original is None or getattr(original, "_advisor_save_watch", False):
                continue
            setattr(module, name, self._wrap(f"dcp.{name}", original))
            add_undo(lambda n=name, o=original: setattr(module, n, o))
            package = sys.modules.get("torch.distributed.checkpoint")
            if package is not None and getattr(package, name, None) is original:
                setattr(package, name, getattr(module, name))
                add_undo(lambda n=name, o=original, p=package: setattr(p, n, o))

    def _wrap(self, api: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def save(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._inside, "active", False):
                return original(*args, **kwargs)
            self._inside.active = True
            try:
                obj = args[0] if args else kwargs.get("obj", kwargs.get("state_dict"))
                self.observe(api, obj)
                return original(*args, **kwargs)
            finally:
                self._inside.active = False

        save._advisor_save_watch = True  # type: ignore[attr-defined]
        return save

    def observe(self, api: str, obj: Any) -> None:
        """Report a save of captured state (never raises: saving must go on as the script wrote it)."""
        try:
            optimizers = self._optimizers()
            saves, sharded, opts = contents(obj, self._models(), optimizers, statefuls=api != "torch.save")
            if not saves:
                return
            key = (api, tuple(saves), sharded)
            if key not in self._seen:
                self._seen.add(key)
                self._notify("checkpoint_save", {"api": api, "saves": saves, "sharded": sharded, "step": self._step()})
            stage = max((registry.in_force("zero", o) or 0 for o in opts or optimizers), default=0)
            if partial_state(api, saves, stage):
                what = " and ".join(f"{s}.state_dict()" for s in saves)
                self._warn(f"the script saved {what} with {api} while ZeRO-{stage} is in force: this rank's "
                           "checkpoint holds only its own shard of the state; revert ZeRO before saving, or "
                           "save from every rank with torch.distributed.checkpoint (stages 2 and 3)",
                           checkpoint_api=api, zero_stage=stage)
        except Exception:  # noqa: BLE001 - a watcher's bug must not fail the script's save
            pass


class _SaverFinder(importlib.abc.MetaPathFinder):
    """Wraps DCP's saver functions when ``state_dict_saver`` is first imported (see the module
    docstring); every other import passes through (``find_spec`` returns None)."""

    def __init__(self, on_load: Callable[[Any], None]) -> None:
        self.on_load = on_load

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != DCP_SAVER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        # The module's own loader stays (tracebacks and inspect read its source through it); only
        # this instance's exec_module is wrapped, and the instance serves this one module.
        loader = spec.loader
        exec_module = loader.exec_module
        on_load = self.on_load

        def exec_and_wrap(module: Any) -> None:
            exec_module(module)
            try:
                on_load(module)
            except Exception:  # noqa: BLE001 - the import itself must not fail because of us
                pass

        loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec
