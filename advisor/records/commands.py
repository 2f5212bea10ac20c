"""Commands from the controller to every rank's executor, as typed records.

The wire shape is unchanged from the untyped dicts they replace:
``{"type": "apply", "recommendation": {...}, "at_step": int|None, "measure_steps": int,
"confirmed": bool, "digest": str|None}`` (the recommendation in its ``to_dict()`` form)
and ``{"type": "revert", "at_step": int}`` (``at_step`` left out when None: the next boundary,
as older controllers sent it). ``command_from_dict`` rebuilds one with every field checked,
the recommendation included (``advisor.records.jsonable.decode``), and raises ``ValueError``
naming what is wrong, or the valid types for an unknown one; unknown keys are ignored (a newer
controller may add fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from advisor.records.advice import Recommendation
from advisor.records.jsonable import decode

DEFAULT_MEASURE_STEPS = 3  # steps measured after an apply before keep-or-revert
# ``{"type": "release"}``: the controller applies nothing at the step an apply was asked for; a
# rank waiting for that decision goes on (advisor/agent/hold.py, ``ApplyHold``). Not a
# command for the executor: the agent takes it before its command relay.
RELEASE = "release"


@dataclass(frozen=True, kw_only=True)
class ApplyCommand:
    """Apply one recommendation at the boundary starting ``at_step``.

    ``at_step`` None: as soon as the executor is ready. Several ranks start it at one boundary
    whatever the step says or when each copy arrives (``advisor.apply.step_align``; across
    nodes, the command relay). ``measure_steps``: steps measured before keep-or-revert.
    """

    TYPE: ClassVar[str] = "apply"
    recommendation: Recommendation
    at_step: int | None = None
    measure_steps: int = DEFAULT_MEASURE_STEPS
    confirmed: bool = False  # the user accepted a live-opt-in remedy's numerics change
    digest: str | None = None  # advisor.records.remedy.command_digest: every rank checks it enacts the same apply

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "recommendation": self.recommendation.to_dict(), "at_step": self.at_step,
                "measure_steps": self.measure_steps, "confirmed": self.confirmed, "digest": self.digest}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ApplyCommand":
        _check_type(data, cls.TYPE)
        if data.get("measure_steps", 0) is None:  # JSON null: the default, as older controllers meant it
            data = {k: v for k, v in data.items() if k != "measure_steps"}
        return decode(cls, data, where="apply command")


@dataclass(frozen=True, kw_only=True)
class RevertCommand:
    """Revert the most recent remedy still in force (or cancel an apply not yet done).

    ``at_step``: the boundary every rank reverts at, after voting on it (the controller sends one
    past the furthest rank, as for an apply); None: each rank's next boundary (one rank alone).
    """

    TYPE: ClassVar[str] = "revert"
    at_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE} if self.at_step is None else {"type": self.TYPE, "at_step": self.at_step}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RevertCommand":
        _check_type(data, cls.TYPE)
        return decode(cls, data, where="revert command")


Command = ApplyCommand | RevertCommand
COMMAND_TYPES: dict[str, type[ApplyCommand] | type[RevertCommand]] = {
    ApplyCommand.TYPE: ApplyCommand, RevertCommand.TYPE: RevertCommand,
}


def command_from_dict(data: Mapping[str, Any]) -> Command:
    """The typed command of a wire dict; ``ValueError`` for an unknown ``type``."""
    kind = data.get("type") if isinstance(data, Mapping) else None
    cls = COMMAND_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown command type {kind!r}; valid: {sorted(COMMAND_TYPES)}")
    return cls.from_dict(data)


def _check_type(data: Mapping[str, Any], expected: str) -> None:
    if data.get("type") != expected:
        raise ValueError(f"not a {expected!r} command: type {data.get('type')!r}")
