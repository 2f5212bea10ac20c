"""Module names that carry their model's label, as a multi-model script's recommendations do.

With several models (a GAN's ``netG`` and ``netD``) the agent names every module after its model
(``netG.main.3``; advisor/agent/models.py), so the rows of two models never merge, and the
recommender proposes those names. The appliers take names relative to one model's
``named_modules()``. ``resolve_model_names`` turns the first into the second before a remedy is
applied: a param whose names all start with one model's label (and exist in that model once the
label is taken off) is rewritten, and that model goes first in the target, so the applier's
``Target.model_for`` picks it even where both models have a ``main.3``. Anything else is left as
it is (one model: names are not prefixed; a name that only looks prefixed stays, and the applier
names what it cannot find). Names of two models in one remedy are refused: a remedy acts on one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from advisor.apply.target import Target, unwrap_model


def resolve_model_names(target: Target, params: Mapping[str, Any]) -> tuple[Target, dict[str, Any]]:
    """``(target with the named model first, params with names relative to it)``."""
    models, labels = target.wrapped_models, target.model_labels
    out = dict(params)
    if len(models) < 2 or len(labels) != len(models):
        return target, out
    chosen: int | None = None
    for key, value in params.items():
        names = _names(value)
        owner = _owner(names, labels, models) if names else None
        if owner is None:
            continue
        if chosen is not None and owner != chosen:
            raise ValueError(f"params name modules of both {labels[chosen]!r} and {labels[owner]!r}; "
                             "one remedy acts on one model")
        chosen = owner
        out[key] = _strip(value, labels[owner])
    if chosen is None:
        return target, out
    order = [chosen, *(i for i in range(len(models)) if i != chosen)]
    return dataclasses.replace(target, wrapped_models=[models[i] for i in order],
                               model_labels=[labels[i] for i in order]), out


def _names(value: Any) -> list[str] | None:
    """The module names in a param: a name, a list of names, or a list of lists (pipeline stages)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(isinstance(v, (list, tuple)) and all(isinstance(n, str) for n in v) for v in value):
            return [n for v in value for n in v]
    return None


def _relative(name: str, label: str) -> str | None:
    if name == label:
        return ""  # the model itself
    return name[len(label) + 1:] if name.startswith(label + ".") else None


def _owner(names: list[str], labels: list[str], models: list[Any]) -> int | None:
    """The model every name belongs to once its label is taken off (longest label first)."""
    for index in sorted(range(len(labels)), key=lambda i: -len(labels[i])):
        label = labels[index]
        relative = [_relative(n, label) for n in names] if label else [None]
        if any(r is None for r in relative):
            continue
        table = dict(unwrap_model(models[index]).named_modules())
        if all(r in table for r in relative):
            return index
    return None


def _strip(value: Any, label: str) -> Any:
    if isinstance(value, str):
        return _relative(value, label)
    return type(value)(_strip(v, label) for v in value)
