"""Rules: each reads a ``Profile`` and returns a ``Finding`` or None; ``advise`` runs them all.

A rule is a module here that defines ``RULE``, or a remedy module (``recommend/remedies``) that
defines ``RULE`` for the remedy it proposes. Both are found with ``pkgutil``: adding a rule or a
remedy edits no list. Order: this package's rules by ``ORDER`` (memory first: its finding is the
most severe and its recommendations win id clashes), then the remedies' rules by module name.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from advisor.recommend import remedies
from advisor.recommend.finding import Finding, Rule

__all__ = ["Finding", "Rule", "rules", "RULES"]

ORDER = ("memory", "input")  # the rest of this package follows, by name


def rules() -> list[Rule]:
    """Every rule found, in the order above."""
    names = sorted((i.name for i in pkgutil.iter_modules(__path__)),
                   key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    found: list[Rule] = []
    for name in names:
        rule = getattr(importlib.import_module(f"{__name__}.{name}"), "RULE", None)
        if rule is not None:
            found.append(rule)
    for module in remedies.remedy_modules():
        rule = getattr(module, "RULE", None)
        if rule is not None:
            found.append(rule)
    return found


def __getattr__(name: str) -> Any:
    # ``RULES`` is computed on first use: discovery imports the remedy modules, which import this
    # package's neighbours; doing it at import time would make that a cycle.
    if name == "RULES":
        value = rules()
        globals()["RULES"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
