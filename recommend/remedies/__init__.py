"""Remedies as the recommender sees them: one module per remedy, found without a list to edit.

A remedy module here (``recommend/remedies/<name>.py``) is the *predictor* half of a remedy; its
*applier* half is ``apply/remedies/<name>.py`` in the training process (``apply_<name>``, found by
name). The module defines ``SPEC``, a ``RemedySpec``: the one statement of the remedy's name, apply
class, params and their torch-free check, and plan phase (tests/test_remedy_contract.py checks the
applier takes those params and names that phase), and how it is proposed: the rules it
``addresses`` (``recommend/rules/<rule>.py``) and its ``propose``, which ``recommend/finding.py``'s
``proposed`` calls for every finding of those rules. A remedy with no applier is applied at a
restart and says how: the environment a plan carries (``plan_env``) or the change to the script
(``restart_change``).

Modules without ``SPEC`` (a solver a remedy uses) are skipped. Discovery walks this package with
``pkgutil``, so adding a remedy edits no shared file; a folder ``advisor/recommend/remedies`` under
another ``sys.path`` entry adds predictors the same way (``advisor.records.plugins``).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Mapping

from advisor.recommend.finding import FALLBACK, FIRST, LIVE_FALLBACK, Propose
from advisor.records.advice import APPLY_CLASSES, parse_apply_class, parse_remedy_name
from advisor.records.plugins import with_plugins
from advisor.records.remedy import PHASES, parse_phase, phase_rank

__path__ = with_plugins(__path__, "advisor", "recommend", "remedies")

__all__ = ["APPLY_CLASSES", "RemedySpec", "parse_apply_class", "specs", "spec", "check_params",
           "remedy_modules", "plan_order", "proposers", "PHASES"]

Validate = Callable[[Mapping[str, Any]], None]


def _no_check(params: Mapping[str, Any]) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class RemedySpec:
    """What the controller knows about a remedy without torch.

    ``params``: the keywords its applier requires; ``optional``: those it may take.
    ``validate``: extra checks on the values (``ValueError`` naming what is valid).
    ``phase``: where it goes in a plan that applies several remedies (``PHASES``, ``plan_order``).
    ``addresses``: the rules (``recommend/rules`` module names) whose findings ``propose`` answers;
    ``fallback``: asked only when nothing else proposed for the finding fits its budget;
    ``live_fallback``: asked last, only when nothing proposed that applies live fits it.
    ``plan_env`` / ``restart_change``: how a remedy without a live applier reaches the job at a
    restart (an environment ``advisor plan`` writes into the plan, or a change to the script).
    """

    name: str
    apply_class: str
    params: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    validate: Validate = _no_check
    phase: str
    addresses: tuple[str, ...] = ()
    propose: Propose | None = None
    fallback: bool = False
    live_fallback: bool = False
    plan_env: Mapping[str, str] = field(default_factory=dict)
    restart_change: str | None = None

    def __post_init__(self) -> None:
        parse_remedy_name(self.name)
        parse_apply_class(self.apply_class)
        parse_phase(self.phase)
        if self.addresses and self.propose is None:
            raise ValueError(f"remedy {self.name!r} addresses {list(self.addresses)} but has no propose")

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


def proposers(rule: str) -> list[tuple[Propose, int]]:
    """``(propose, wave)`` of every remedy that addresses ``rule``, by remedy name (the waves:
    ``advisor.recommend.finding.WAVES``)."""
    return [(s.propose, LIVE_FALLBACK if s.live_fallback else FALLBACK if s.fallback else FIRST)
            for name, s in sorted(specs().items()) if rule in s.addresses and s.propose is not None]


def plan_order(names: list[str]) -> list[str]:
    """``names`` in the order a plan applies them: by phase (``advisor.records.remedy.PHASES``,
    where the order is explained), then as given."""
    table = specs()
    return sorted(names, key=lambda n: (phase_rank(table[n].phase if n in table else None), names.index(n)))
