"""The applies and reverts of a session as a person reads them: one row per decision.

Every rank reports its own result of an apply (``SessionState.applied`` holds one per rank),
and all ranks keep or revert together, so two identical "kept" lines would say nothing more.
Results of the same recommendation at the same step with the same outcome make one row that
names the ranks ("all 2 ranks"); ranks that ended differently get a row each, naming them.
Plain data: no textual here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from advisor.records.remedy import applied_name
from advisor.records.results import ApplyHistory


@dataclass(frozen=True, kw_only=True)
class AppliedRow:
    """One decision: the results of every rank that reported it the same way."""

    results: tuple[ApplyHistory, ...]  # in arrival order, one per rank
    ranks: tuple[int, ...]  # the ranks named in them (a revert on request names none)

    @property
    def status(self) -> str:
        return str(self.results[0].status)

    def shown(self, rank: int | None = None) -> ApplyHistory:
        """The result whose figures are shown: ``rank``'s when it reported one, else the first."""
        return next((r for r in self.results if rank is not None and _rank(r) == rank), self.results[0])

    def who(self, world_size: int) -> str:
        """Which ranks: "" on a one-rank job, "all 2 ranks", "rank 1", "ranks 0, 2"."""
        if world_size < 2:
            return ""
        if len(self.ranks) >= world_size or (not self.ranks and len(self.results) >= world_size):
            return f"all {world_size} ranks"
        if not self.ranks:
            return f"{len(self.results)} of {world_size} ranks"
        label = "rank" if len(self.ranks) == 1 else "ranks"
        return f"{label} {', '.join(str(r) for r in self.ranks)}"


def _rank(result: ApplyHistory) -> int | None:
    """The rank that reported ``result`` (an apply's result names it; a revert on request does not)."""
    rank = getattr(result, "rank", None)
    return rank if isinstance(rank, int) else None


def applied_rows(applied: Sequence[ApplyHistory]) -> list[AppliedRow]:
    """``applied`` grouped into decisions, in the order each was first reported."""
    groups: dict[tuple[str, int | None, str], list[ApplyHistory]] = {}
    for result in applied:
        key = (str(result.recommendation_id or result.remedy), result.at_step, str(result.status))
        groups.setdefault(key, []).append(result)
    return [AppliedRow(results=tuple(group), ranks=tuple(sorted({r for g in group if (r := _rank(g)) is not None})))
            for group in groups.values()]


def in_force_names(in_force: Sequence[ApplyHistory]) -> list[str]:
    """The remedies in force, each once (every rank reports its own kept result)."""
    names: list[str] = []
    for result in in_force:
        name = applied_name(result.remedy, result.recommendation_id)
        if name not in names:
            names.append(name)
    return names
