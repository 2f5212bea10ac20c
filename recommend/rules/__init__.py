"""Rules: each diagnoses a ``Profile``; the remedies that address it propose; ``advise`` runs them all.

A rule is a module here that defines ``RULE(profile) -> Finding | None``: a diagnosis named after
the module (``Finding.rule``), no recommendations. ``run`` gives it its remedies the one way every
rule gets them (``recommend/finding.py``'s ``proposed``: each remedy whose spec addresses the rule),
then the module's optional ``CONCLUDE(profile, finding) -> Finding``, which may say what the
proposals leave open (the memory rule: that nothing fits, and what would). Rules are found with
``pkgutil``: adding a rule or a remedy edits no list. Order: ``ORDER`` first (memory: its finding is
the most severe and its recommendations win id clashes), then the rest by name.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType
from typing import Any, Callable

from advisor.recommend import remedies
from advisor.recommend.finding import Finding, Rule, proposed

__all__ = ["Finding", "Rule", "rules", "run", "RULES"]

ORDER = ("memory", "input")  # the rest of this package follows, by name


def _modules() -> list[ModuleType]:
    names = sorted((i.name for i in pkgutil.iter_modules(__path__) if not i.name.startswith("_")),
                   key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    modules = [importlib.import_module(f"{__name__}.{name}") for name in names]
    return [m for m in modules if callable(getattr(m, "RULE", None))]


def run(name: str, profile: Any) -> Finding | None:
    """Rule ``name``'s finding on ``profile`` with its remedies' proposals (None: no finding)."""
    module = importlib.import_module(f"{__name__}.{name}")
    finding: Finding | None = module.RULE(profile)
    if finding is None:
        return None
    if finding.rule != name:  # remedies address rules by module name
        raise ValueError(f"rule {name!r} named its finding {finding.rule!r}")
    finding = proposed(profile, finding, remedies.proposers(finding.rule))
    conclude: Callable[[Any, Finding], Finding] | None = getattr(module, "CONCLUDE", None)
    return conclude(profile, finding) if finding is not None and conclude is not None else finding


def rules() -> list[Rule]:
    """Every rule found, in the order above, each giving its finding with its remedies."""
    return [functools.partial(run, m.__name__.rpartition(".")[2]) for m in _modules()]


def __getattr__(name: str) -> Any:
    # ``RULES`` is computed on first use: discovery imports the rule modules, which import this
    # package's neighbours; doing it at import time would make that a cycle.
    if name == "RULES":
        value = rules()
        globals()["RULES"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
