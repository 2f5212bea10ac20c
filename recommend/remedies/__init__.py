"""Remedies as the recommender sees them: one module per remedy, found without a list to edit.

A remedy module here (``recommend/remedies/<name>.py``) is the *predictor* half of a remedy; its
*applier* half is ``apply/remedies/<name>.py`` in the training process. The module defines
``SPEC`` (a ``RemedySpec``: the name, the apply class, the params and their torch-free check,
the orchestration order) and, when the remedy is proposed by a rule of its own, ``RULE``. Memory
remedies instead set ``SPEC.propose``: the memory rule diagnoses once and asks each of them.

Modules without ``SPEC`` (a solver a remedy uses) are skipped. Discovery walks this package with
``pkgutil``, so adding a remedy edits no shared file.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Mapping

from advisor.records.advice import APPLY_CLASSES, parse_apply_class, register_remedy
from advisor.records.remedy import PHASES, parse_phase, phase_rank

if TYPE_CHECKING:  # pragma: no cover
    from advisor.recommend.profile import Profile
    from advisor.records.advice import Recommendation

__all__ = ["APPLY_CLASSES", "RemedySpec", "parse_apply_class", "specs", "spec", "check_params",
           "remedy_modules", "plan_order", "PHASES"]

Validate = Callable[[Mapping[str, Any]], None]
# propose(profile, budget_bytes, evidence) -> recommendations for a memory finding
Propose = Callable[["Profile", int, list[dict[str, object]]], "list[Recommendation]"]


def _no_check(params: Mapping[str, Any]) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class RemedySpec:
    """What the controller knows about a remedy without torch.

    ``params``: the keywords its applier requires; ``optional``: those it may take.
    ``validate``: extra checks on the values (``ValueError`` naming what is valid).
    ``phase``: where it goes in a plan that applies several remedies (``PHASES``, ``plan_order``).
    ``addresses``: the bottleneck whose rule asks ``propose`` (None: the remedy has its own rule).
    """

    name: str
    apply_class: str
    params: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    validate: Validate = _no_check
    phase: str
    addresses: str | None = None
    propose: Propose | None = None

    def __post_init__(self) -> None:
        parse_apply_class(self.apply_class)
        parse_phase(self.phase)
        register_remedy(self.name)  # a Recommendation may now name it

    def check(self, params: Any) -> None:
        """``ValueError`` when ``params`` would not fit the applier (names, then values)."""
        if not isinstance(params, Mapping):
            raise ValueError(f"remedy {self.name!r}: params must be an object")
        accepted = sorted(self.params + self.optional)
        unknown = sorted(set(params) - set(accepted))
        missing = [p for p in self.params if p not in params]
        if unknown or missing:
            raise ValueError(f"remedy {self.name!r} takes keywords {accepted}"
                             + (f"; unknown: {unknown}" if unknown else "")
                             + (f"; missing: {missing}" if missing else ""))
        self.validate(params)


def remedy_modules() -> list[ModuleType]:
    """Every module of this package that defines ``SPEC``, by name."""
    out = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "SPEC", None), RemedySpec):
            out.append(module)
    return out


def specs() -> dict[str, RemedySpec]:
    """Remedy name -> spec, for every remedy module found."""
    return {m.SPEC.name: m.SPEC for m in remedy_modules()}


def spec(name: str) -> RemedySpec:
    found = specs()
    if name not in found:
        raise ValueError(f"unknown remedy {name!r}; valid: {sorted(found)}")
    return found[name]


def check_params(name: str, params: Any) -> None:
    """The controller's torch-free check of a remedy and its params (plans, apply commands)."""
    spec(name).check(params)


def plan_order(names: list[str]) -> list[str]:
    """``names`` in the order a plan applies them: by phase (``advisor.records.remedy.PHASES``,
    where the order is explained), then as given."""
    table = specs()
    return sorted(names, key=lambda n: (phase_rank(table[n].phase if n in table else None), names.index(n)))
