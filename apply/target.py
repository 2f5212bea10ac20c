"""What a remedy acts on: the objects the agent captured when the script built them.

``apply_<name>(target, *, params)`` receives a ``Target``. Models come both as the script holds
them (``wrapped_models``: DDP, FSDP, ``torch.compile`` wrappers kept) and unwrapped
(``models``); ``optimizers`` and ``lr_schedulers`` are the objects the script's loop steps, so
a remedy that changes one in place changes what the loop uses. ``retarget_optimizer`` points
the schedulers the script holds at a replacement optimizer.

``unwrap`` is the one wrapper-unwrapping function of the advisor (the agent uses it too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def unwrap(module: nn.Module) -> tuple[nn.Module, str | None]:
    """Strip DDP, DataParallel, legacy FSDP and ``torch.compile`` wrappers.

    Returns (the user's module, the outermost wrapper's class name or None; "fully_shard" for a
    module FSDP2 changed in place). Matched by class name so that a subclass from another
    library with the same role is not required to import ours.
    """
    wrapper = None
    for _ in range(8):  # wrappers nest a few deep at most; bound it anyway
        cls = type(module).__name__
        inner = None
        if cls in _WRAPPERS:
            inner = getattr(module, "module", None)
        elif cls == "OptimizedModule":
            inner = getattr(module, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        wrapper = wrapper or cls
        module = inner
    if wrapper is None:
        try:
            from torch.distributed.fsdp import FSDPModule  # FSDP2 changes the class in place

            if isinstance(module, FSDPModule):
                wrapper = "fully_shard"
        except ImportError:  # pragma: no cover - torch without distributed
            pass
    return module, wrapper


def unwrap_model(module: nn.Module) -> nn.Module:
    """The user's module under any wrappers (names in recommendations are relative to it)."""
    return unwrap(module)[0]


@dataclass(kw_only=True, eq=False)
class Target:
    """Live objects of the training process, as the agent captured them (see the module docstring)."""

    wrapped_models: list[nn.Module] = field(default_factory=list)
    # Each wrapped model's name in the script (``netG``), in the same order; what prefixes its
    # module names when the script has several models (``apply/model_names.py``). Empty: unknown.
    model_labels: list[str] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    lr_schedulers: list[Any] = field(default_factory=list)
    wrappers: list[nn.Module] = field(default_factory=list)  # DDP / FSDP objects the script built
    process_group: Any = None  # the job's group (the DDP wrapper's, else the default), None alone
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    rank: int = 0
    world_size: int = 1
    # The script's DataLoaders in construction order, and the iterator each one last handed out
    # (the one the script's loop holds; None before the first ``iter()``).
    dataloaders: list[Any] = field(default_factory=list)
    dataloader_iterators: list[Any] = field(default_factory=list)
    # notify(event name, data): report a changed setting to the controller (the agent's emit);
    # None where nobody listens (tests, bare targets).
    notify: Any = None

    @property
    def models(self) -> list[nn.Module]:
        return [unwrap_model(m) for m in self.wrapped_models]

    @classmethod
    def of(cls, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()) -> "Target":
        """A target over one model (tests, and callers that hold a model only)."""
        params = list(model.parameters())
        return cls(wrapped_models=[model], optimizers=list(optimizers),
                   wrappers=[model] if unwrap(model)[1] else [],
                   device=params[0].device if params else torch.device("cpu"))

    def model_for(self, names: Sequence[str] | None = None) -> nn.Module:
        """The (wrapped) model whose unwrapped module has every name in ``names``; else the first."""
        if not self.wrapped_models:
            raise RuntimeError("no model discovered yet in this process")
        if names and len(self.wrapped_models) > 1:
            for model in self.wrapped_models:
                table = dict(unwrap_model(model).named_modules())
                if all(n in table for n in names):
                    return model
        return self.wrapped_models[0]

    def retarget_optimizer(self, old: torch.optim.Optimizer, new: torch.optim.Optimizer) -> None:
        """Make the schedulers (and this target) use ``new`` where they used ``old``."""
        for scheduler in self.lr_schedulers:
            if getattr(scheduler, "optimizer", None) is old:
                scheduler.optimizer = new
        self.optimizers = [new if o is old else o for o in self.optimizers]


def as_target(target: "Target | nn.Module") -> Target:
    """Appliers accept a bare model too (``Target.of``)."""
    return target if isinstance(target, Target) else Target.of(target)
