"""Apply several remedies (a plan) in the fixed order of ``advisor.records.remedy.PHASES``.

Why an order at all: checkpointing and offload name submodules of the user's model and patch
their forwards; a sharding or pipeline remedy then wraps or splits those modules and carries the
patched forwards along. The other way round, the names would point into wrappers or to modules
now on another rank. Optimizer remedies sit between: they act on the user's optimizer object,
whose state a sharding remedy re-partitions afterwards. Within one phase, the plan's order holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from advisor.apply import registry
from advisor.apply.target import Target
from advisor.records.remedy import phase_rank

logger = logging.getLogger("advisor.apply")


@dataclass(kw_only=True)
class Outcome:
    """One entry's result: a handle when it applied, else the exception it raised."""

    index: int  # position in the caller's list
    remedy: str
    handle: registry.RemedyHandle | None = None
    error: BaseException | None = None


def ordered(entries: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]:
    """Indexes of ``entries`` in application order (by phase, then as given)."""
    return sorted(range(len(entries)), key=lambda i: (phase_rank(registry.phase(entries[i][0])), i))


def apply_in_order(target: Target, entries: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Outcome]:
    """Apply each (remedy, params) in phase order; one that raises is reported, the rest still apply.

    Entries of a plan are independent remedies for a job that may not fit without them, so a
    failure does not undo the others (appliers are atomic: a failed one changed nothing).
    Outcomes come back in the caller's order.
    """
    outcomes: dict[int, Outcome] = {}
    for i in ordered(entries):
        name, params = entries[i]
        try:
            outcomes[i] = Outcome(index=i, remedy=name, handle=registry.apply_remedy(target, name, params))
        except Exception as exc:
            logger.warning("Applying %s failed: %s", name, exc)
            outcomes[i] = Outcome(index=i, remedy=name, error=exc)
    return [outcomes[i] for i in range(len(entries))]
