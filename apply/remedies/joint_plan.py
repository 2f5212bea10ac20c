"""A joint plan applied live as one unit: its parts in phase order, reverted whole.

The predictor half (``recommend/remedies/joint_plan.py``) plans a ZeRO stage and activation
checkpointing together; this applier enacts any list of parts the same way a plan file's entries
are enacted (``advisor.apply.orchestrator``: checkpointing patches the blocks' forwards first, then
the stage wraps the blocks and carries the patched forwards along). Unlike a plan file's entries,
the parts stand or fall together: the budget was met by the whole, so a part that fails undoes
the ones before it (in reverse order) and the plan raises, leaving the job as it was. The
executor keeps or reverts the returned handle like any remedy's, on every rank together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from advisor.apply import registry
from advisor.apply.orchestrator import ordered
from advisor.apply.target import Target

logger = logging.getLogger("advisor.apply")

PHASE = "layout"  # the plan as a whole goes where its last part would


@dataclass(eq=False)
class JointHandle:
    """The parts' handles in the order they were applied; ``revert()`` undoes them last first."""

    remedies: tuple[str, ...]
    handles: list[Any] = field(default_factory=list)
    reverted: bool = False

    @property
    def step_period(self) -> int:
        return max([int(getattr(h, "step_period", 1) or 1) for h in self.handles] or [1])

    def commit(self) -> None:
        for handle in self.handles:
            commit = getattr(handle, "commit", None)
            if callable(commit):
                commit()

    def revert(self) -> None:
        """Revert every part, the last applied first; safe to call twice. A part whose revert
        raises does not stop the others'; the first error is raised after them."""
        if self.reverted:
            return
        self.reverted = True
        first: BaseException | None = None
        for handle in reversed(self.handles):
            try:
                handle.revert()
            except BaseException as exc:  # noqa: BLE001 - every part gets its revert
                first = first or exc
        logger.info("Reverted the joint plan %s", " + ".join(self.remedies))
        if first is not None:
            raise first


def apply_joint_plan(target: Target, *, parts: Sequence[Mapping[str, Any]]) -> JointHandle:
    """Apply every ``{"remedy", "params"}`` of ``parts`` in phase order; atomic: when one fails, the
    ones applied before it are reverted and its error is raised."""
    entries = [(str(p["remedy"]), dict(p["params"])) for p in parts]
    if len(entries) < 2:
        raise ValueError("a joint plan has two or more parts")
    order = ordered(entries)
    handle = JointHandle(remedies=tuple(entries[i][0] for i in order))
    for i in order:
        name, params = entries[i]
        try:
            handle.handles.append(registry.apply_remedy(target, name, params))
        except Exception as exc:
            logger.warning("Applying %s failed: %s", name, exc)
            handle.revert()  # the parts before it (appliers are atomic: the failed one changed nothing)
            raise ValueError(f"joint plan: {name} failed ({exc}); "
                             "the parts applied before it were reverted") from exc
    logger.info("Applied the joint plan %s as one unit", " + ".join(handle.remedies))
    return handle
