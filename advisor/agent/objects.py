"""What the script built and trains: its models, its optimizers, and what a remedy acts on.

Models are found at their first forward and confirmed by an optimizer or a backward
(``advisor/agent/models.py``); optimizers are known when built or when they first step;
schedulers, DDP/FSDP wrappers and DataLoaders are captured when built
(``advisor/agent/capture.py``), and the script's checkpoint saves are watched
(``advisor/agent/saves.py``). The device is the first model's. ``target()`` hands all of it to the
apply executor. Each model and optimizer found is reported once (``ModelInfo``, ``OptimizerInfo``).
"""

from __future__ import annotations

import gc
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist

from advisor.agent.capture import AddUndo, Capture
from advisor.agent.models import ModelRegistry
from advisor.agent.naming import unique_label
from advisor.agent.outbox import Outbox
from advisor.agent.saves import SaveWatch
from advisor.apply.target import Target
from advisor.records.samples import ModelInfo, OptimizerInfo


class ScriptObjects:
    """The script's models, optimizers and captured objects, and the device they train on."""

    def __init__(self, outbox: Outbox, *, rank: int, world_size: int, comm_switch: bool = True) -> None:
        self._outbox = outbox
        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cpu")  # the first model's parameters' device, once one is found
        self.capture = Capture()  # what the script built, for remedies (installed by ``install``)
        self._comm_switch = comm_switch
        self._models = ModelRegistry()
        self._optimizers: list[weakref.ref] = []
        self._opt_labels: dict[int, str] = {}
        self._first_forward_callbacks: list[Callable[[torch.nn.Module], None]] = []

    def install(self, add_undo: AddUndo, *, step: Callable[[], int],
                on_optimizer: Callable[[torch.optim.Optimizer], None]) -> None:
        """Wrap the constructors and the checkpoint savers; ``add_undo`` gets what restores each.
        ``on_optimizer``: called for each optimizer built (the agent's ``optimizer_created``)."""
        self.capture.install(add_undo, on_optimizer=on_optimizer, notify=self._notify,
                             comm_switch_on=self._comm_switch)
        # The script's own checkpoint saves, which ZeRO would make partial.
        SaveWatch(models=self.models, optimizers=lambda: self.capture.optimizers() or self.optimizers(),
                  notify=self._notify, warn=self._outbox.warn, step=step).install(add_undo)

    def adopt_existing(self) -> int:
        """Capture the optimizers, schedulers, wrappers and DataLoaders that exist now, built before
        ``install`` (an in-process session opened after the script built them): one pass over the
        garbage collector's objects, once (0.13-0.25 s for the 410,000 objects of a process that imported
        transformers and lightning, on a loaded 2-core machine: a session's start, not a step). An
        optimizer found here is known before its first step, so a loop of several optimizers
        gets its period from the first step on."""
        return self.capture.adopt(gc.get_objects())

    def _notify(self, name: str, data: dict[str, Any]) -> None:
        self._outbox.event(name, data, step=None)

    # -- models ------------------------------------------------------------------------
    def models(self) -> list[torch.nn.Module]:
        """Discovered root models, unwrapped (DDP/FSDP wrappers removed)."""
        return self._models.models()

    def wrapped_models(self) -> list[torch.nn.Module]:
        """Discovered root models as the script holds them (wrappers kept)."""
        return self._models.wrapped_models()

    def model_labels(self) -> list[str]:
        """Each of ``wrapped_models()``'s name in the script, in the same order."""
        return self._models.labels()

    def module_names(self) -> dict[int, str]:
        """id(module) -> qualified name, for every module of every model found so far."""
        return self._models.names()

    def module_name(self, module: torch.nn.Module) -> str | None:
        return self._models.module_name(module)

    def numbered_modules(self) -> dict[int, tuple[str, weakref.ref]]:
        """id(module) -> (qualified name, weak reference) for the numbered members of containers."""
        return self._models.numbered()

    def refresh_names(self) -> None:
        """Rebuild the module-name map (after a remedy changed the module tree)."""
        self._models.refresh_names()

    def parameter_versions(self) -> int:
        """Sum of the models' parameter version counters: in-place updates under no_grad bump
        them (``p -= lr * p.grad``); an update through ``p.data`` does not."""
        return sum(p._version for model in self.models() for p in model.parameters())

    def on_first_forward(self, callback: Callable[[torch.nn.Module], None]) -> None:
        """Run ``callback(model)`` when the first model is found, before its forward runs (plans)."""
        self._first_forward_callbacks.append(callback)

    def see(self, module: torch.nn.Module) -> None:
        """A top-level forward of ``module`` (outside backward)."""
        self._found(self._models.see(module, self.optimizers()))

    def confirm(self, *, optimizer: Any = None, by_grad: bool = False) -> None:
        """An optimizer steps (or, ``by_grad``, a backward ended): the candidates it makes models."""
        if not self._models.waiting:  # every step's case once the model is found: nothing to confirm
            return
        optimizers = [optimizer] if optimizer is not None else self.optimizers()
        self._found(self._models.confirm(optimizers, by_grad=by_grad))

    def _found(self, found: list[tuple[torch.nn.Module, ModelInfo]]) -> None:
        for model, info in found:
            params = list(model.parameters())
            if params:
                self.device = params[0].device
            self._outbox.emit(ModelInfo(**{**info.to_dict(), "rank": self.rank}))
            callbacks, self._first_forward_callbacks = self._first_forward_callbacks, []
            for callback in callbacks:  # each runs once, when the first model is found
                callback(model)

    # -- optimizers --------------------------------------------------------------------
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Optimizers built or seen stepping, in that order."""
        return [o for ref in self._optimizers if (o := ref()) is not None]

    def optimizer_label(self, optimizer: torch.optim.Optimizer) -> str:
        """Its class, numbered in the order built (``Adam``, ``Adam_1``)."""
        return self._opt_labels.get(id(optimizer), type(optimizer).__name__)

    def optimizer_created(self, optimizer: torch.optim.Optimizer) -> None:
        if any(ref() is optimizer for ref in self._optimizers):
            return
        self._optimizers.append(weakref.ref(optimizer))
        self._opt_labels[id(optimizer)] = unique_label(None, type(optimizer).__name__, self._opt_labels.values())
        groups = []
        for group in getattr(optimizer, "param_groups", []):
            groups.append({k: v for k, v in group.items()
                           if k != "params" and isinstance(v, (int, float, str, bool, type(None)))})
        count = sum(p.numel() for g in getattr(optimizer, "param_groups", []) for p in g["params"])
        self._outbox.emit(OptimizerInfo(rank=self.rank, name=type(optimizer).__name__, parameter_count=count,
                                        param_groups=groups, label=self._opt_labels.get(id(optimizer))))

    # -- for remedies ------------------------------------------------------------------
    def target(self) -> Target:
        """The live objects, for ``apply_<remedy>(target, ...)``."""
        capture = self.capture
        optimizers = capture.optimizers()
        for opt in self.optimizers():  # one built before the hooks (rare) is still known once it steps
            if not any(o is opt for o in optimizers):
                optimizers.append(opt)
        wrappers = capture.wrappers()
        group = None
        for wrapper in wrappers:
            group = getattr(wrapper, "process_group", None)
            if group is not None:
                break
        if group is None and dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
        loaders = capture.dataloaders()
        return Target(wrapped_models=self.wrapped_models(), model_labels=self.model_labels(),
                      optimizers=optimizers, lr_schedulers=capture.lr_schedulers(), wrappers=wrappers,
                      process_group=group, device=self.device, rank=self.rank, world_size=self.world_size,
                      dataloaders=loaders, dataloader_iterators=[capture.running_iterator(d) for d in loaders],
                      notify=self._notify)
