"""Which top-level modules are models, and the names of their modules.

A top-level module (the outermost forward outside backward) is a model once an optimizer
holds, or a backward reaches, its trainable parameters: loss modules have nothing to train
and reloaded copies are never trained. Until then it is a candidate, named while the
script's frame that calls it is on the stack (see ``naming``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from advisor.agent.block_timer import numbered
from advisor.agent.naming import find_variable_name, unique_label
from advisor.apply.target import unwrap  # the one unwrapping function
from advisor.records.samples import ModelInfo

MAX_CANDIDATES = 16  # reloaded copies add up over a long run


@dataclass
class _Candidate:
    model: weakref.ref
    wrapped: weakref.ref
    name: str | None
    source: str


class ModelRegistry:
    """The models found so far, their labels and their modules' names."""

    def __init__(self) -> None:
        self._roots: list[tuple[weakref.ref, weakref.ref]] = []  # (unwrapped, wrapped)
        self._candidates: list[_Candidate] = []
        self._rejected: weakref.WeakSet = weakref.WeakSet()  # top-level modules with nothing to train
        self._labels: dict[int, str] = {}  # id(model) -> its name in the script
        self._names: dict[int, str] = {}
        self._numbered: dict[int, tuple[str, weakref.ref]] = {}  # the block timer's modules
        # The last top-level module seen that is (or wraps) a model found: every step's forward
        # starts with it, and it stays one (roots are only added), so ``see`` ends at one identity
        # test (the rest, run cold once a step, cost a 17 ms light step about 25 us).
        self._last_root: weakref.ref | None = None

    def models(self) -> list[torch.nn.Module]:
        return [m for ref, _ in self._roots if (m := ref()) is not None]

    def wrapped_models(self) -> list[torch.nn.Module]:
        return [m for _, ref in self._roots if (m := ref()) is not None]

    def labels(self) -> list[str]:
        """Each model's name in the script, in the order of ``wrapped_models()``."""
        return [self._labels.get(id(m), type(m).__name__) if (m := ref()) is not None else ""
                for ref, wrapped in self._roots if wrapped() is not None]

    def names(self) -> dict[int, str]:
        """id(module) -> qualified name, for every module of every model found so far."""
        return self._names

    def module_name(self, module: torch.nn.Module) -> str | None:
        return self._names.get(id(module))

    def numbered(self) -> dict[int, tuple[str, weakref.ref]]:
        """id(module) -> (qualified name, weak reference) for the numbered members of containers
        (``blocks.3``): the modules the block timer times."""
        return self._numbered

    def refresh_names(self) -> None:
        """With several models every name starts with its model's label (``netG.main.3``)."""
        self._names = {}
        self._numbered = {}
        models = self.models()
        for model in models:
            prefix = self._labels.get(id(model), "") if len(models) > 1 else ""
            for name, sub in model.named_modules():
                qualified = self._names.setdefault(id(sub), ".".join(part for part in (prefix, name) if part))
                if numbered(qualified):
                    self._numbered.setdefault(id(sub), (qualified, weakref.ref(sub)))

    def _is_root(self, model: torch.nn.Module) -> bool:
        return any(ref() is model for ref, _ in self._roots)

    def _known(self, model: torch.nn.Module) -> bool:
        return (self._is_root(model) or self.module_name(model) is not None
                or any(c.model() is model for c in self._candidates))

    def see(self, module: torch.nn.Module, optimizers: Iterable[Any]) -> list[tuple[torch.nn.Module, ModelInfo]]:
        """A top-level forward of ``module``: the models it confirms (at most one)."""
        last = self._last_root
        if last is not None and last() is module:
            return []
        model, _ = unwrap(module)
        if self._is_root(model):
            self._last_root = weakref.ref(module)
            return []
        if model in self._rejected or self._known(model):
            return []
        if not any(p.requires_grad for p in model.parameters()):
            self._rejected.add(model)
            return []
        name, source = find_variable_name(module, model)
        candidate = _Candidate(model=weakref.ref(model), wrapped=weakref.ref(module), name=name, source=source)
        self._candidates = [*self._candidates[-(MAX_CANDIDATES - 1):], candidate]
        return self.confirm(optimizers)

    @property
    def waiting(self) -> bool:
        """Some top-level module waits to be confirmed a model (``confirm`` may find one)."""
        return bool(self._candidates)

    def confirm(self, optimizers: Iterable[Any], *, by_grad: bool = False) -> list[tuple[torch.nn.Module, ModelInfo]]:
        """Candidates whose parameters ``optimizers`` hold (or, ``by_grad``, that have a gradient)."""
        if not self._candidates:
            return []
        held = {id(p) for o in optimizers for g in getattr(o, "param_groups", []) for p in g["params"]}
        found = []
        for candidate in list(self._candidates):
            model = candidate.model()
            if model is None:
                self._candidates.remove(candidate)
                continue
            params = [p for p in model.parameters() if p.requires_grad]
            if any(id(p) in held for p in params) or (by_grad and any(p.grad is not None for p in params)):
                self._candidates.remove(candidate)
                found.append((model, self._add(model, candidate)))
        return found

    def _add(self, model: torch.nn.Module, candidate: _Candidate) -> ModelInfo:
        # Never truth-test a module: a compiled one forwards __len__ to a module without it
        # (TypeError: Net does not support len()).
        held = candidate.wrapped()
        wrapped = held if held is not None else model
        _, wrapper = unwrap(wrapped)
        label = unique_label(candidate.name, type(model).__name__, self._labels.values())
        self._labels[id(model)] = label
        self._roots.append((weakref.ref(model), weakref.ref(wrapped)))
        self.refresh_names()
        params = list(model.parameters())
        modules = []
        for name, sub in model.named_modules():
            if len(modules) >= 2000:
                break
            modules.append({
                "name": name,
                "type": type(sub).__name__,
                "depth": 0 if not name else name.count(".") + 1,
                "parameter_bytes": sum(p.numel() * p.element_size() for p in sub.parameters(recurse=False)),
            })
        return ModelInfo(
            name=type(model).__name__,
            label=label,
            label_source=candidate.source or "class",
            wrapper=wrapper,
            parameter_count=sum(p.numel() for p in params),
            parameter_bytes=sum(p.numel() * p.element_size() for p in params),
            trainable_parameter_count=sum(p.numel() for p in params if p.requires_grad),
            modules=modules,
        )
