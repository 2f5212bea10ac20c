"""The outcome of applying one remedy: predicted against measured, and what was decided.

Pure standard library: the executor builds it in the training process, it
travels as ``Event(name="apply_result", data=result.to_dict())`` and the
report reads it back with ``ApplyResult.from_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Mapping

from advisor.records.jsonable import known_fields, to_json

# "interrupted": the job ended (SIGTERM, SIGKILL, the script's own end) while the remedy was in
# force and before its measurement window completed, so nothing was decided; its measurements
# hold what was seen. Neither "kept" (it was not judged) nor absent (it ran).
Status = Literal["kept", "reverted", "failed", "interrupted"]
STATUSES: tuple[str, ...] = ("kept", "reverted", "failed", "interrupted")


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """Peak memory and step time over a window of steps (None where not measured).

    ``peak_memory_bytes``: the highest ``StepSample.peak_memory_bytes`` (the
    allocator peak of deep-sampled steps, ``torch.cuda.max_memory_allocated``)
    in the window, bytes. ``step_time_s``: median ``StepSample.time_s``
    (wall clock between optimizer-step boundaries), seconds.
    """

    peak_memory_bytes: int | None = None
    step_time_s: float | None = None
    steps: tuple[int, ...] = ()  # the StepSample indexes the figures come from
    time_steps: tuple[int, ...] = ()  # the steps ``step_time_s`` is the median of
    peak_steps: tuple[int, ...] = ()  # the steps ``peak_memory_bytes`` is the maximum of
    step_kind: str | None = None  # "light" or "deep": the kind of the timed steps (before and after agree)

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_memory_bytes": self.peak_memory_bytes,
            "step_time_s": to_json(self.step_time_s),
            "steps": list(self.steps),
            "time_steps": list(self.time_steps),
            "peak_steps": list(self.peak_steps),
            "step_kind": self.step_kind,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "Measurement":
        data = data or {}
        return cls(
            peak_memory_bytes=data.get("peak_memory_bytes"),
            step_time_s=data.get("step_time_s"),
            steps=tuple(data.get("steps") or ()),
            time_steps=tuple(data.get("time_steps") or ()),
            peak_steps=tuple(data.get("peak_steps") or ()),
            step_kind=data.get("step_kind"),
        )


@dataclass(frozen=True, kw_only=True)
class ApplyResult:
    """One remedy applied (or attempted) at a step boundary of one rank.

    Travels as ``Event(name=ApplyResult.EVENT, data=result.to_dict())``.
    """

    EVENT: ClassVar[str] = "apply_result"
    remedy: str
    recommendation_id: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    rank: int = 0
    at_step: int | None = None  # first step that ran with the remedy (None: never applied)
    predicted: Measurement = field(default_factory=Measurement)
    before: Measurement = field(default_factory=Measurement)
    after: Measurement = field(default_factory=Measurement)
    status: Status
    error: str | None = None  # "ExcType: message" when status is "failed"
    reason: str = ""  # why kept / reverted, in one sentence

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r}; valid: {list(STATUSES)}")

    def with_(self, **changes: Any) -> "ApplyResult":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "remedy": self.remedy,
            "recommendation_id": self.recommendation_id,
            "params": to_json(self.params),
            "rank": self.rank,
            "at_step": self.at_step,
            "predicted": {
                "peak_memory_bytes": self.predicted.peak_memory_bytes,
                "step_time_s": to_json(self.predicted.step_time_s),
            },
            "measured": {"before": self.before.to_dict(), "after": self.after.to_dict()},
            "status": self.status,
            "error": self.error,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ApplyResult":
        measured = data.get("measured") or {}
        return cls(
            remedy=data["remedy"],
            recommendation_id=data.get("recommendation_id"),
            params=dict(data.get("params") or {}),
            rank=data.get("rank", 0),
            at_step=data.get("at_step"),
            predicted=Measurement.from_dict(data.get("predicted")),
            before=Measurement.from_dict(measured.get("before")),
            after=Measurement.from_dict(measured.get("after")),
            status=data["status"],
            error=data.get("error"),
            reason=data.get("reason", ""),
        )


@dataclass(frozen=True, kw_only=True)
class RevertResult:
    """A kept remedy reverted later on the user's request, at a step boundary of one rank.

    Travels as ``Event(name="apply_reverted", data=result.to_dict())``; the controller's
    history lists it with status "reverted" (it has no ``measured`` key, unlike an
    ``ApplyResult`` reverted after its measurement window).
    """

    EVENT: ClassVar[str] = "apply_reverted"
    remedy: str
    recommendation_id: str | None = None
    at_step: int | None = None  # first step that ran without the remedy
    reason: str = "reverted on request"

    def to_dict(self) -> dict[str, Any]:
        return {"remedy": self.remedy, "recommendation_id": self.recommendation_id,
                "at_step": self.at_step, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RevertResult":
        return cls(**known_fields(cls, data))


@dataclass(frozen=True, kw_only=True)
class ApplyStarted:
    """A remedy applied at a step boundary (by a command, or by a plan before step 0); measuring follows.

    Travels as ``Event(name="apply_started", data=started.to_dict())``. The optional keys keep
    the two senders' shapes: the executor adds ``measure_steps`` and ``before``, a plan adds
    ``from_plan: true``.
    """

    EVENT: ClassVar[str] = "apply_started"
    remedy: str
    recommendation_id: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    at_step: int | None = None
    measure_steps: int | None = None
    before: Measurement | None = None
    from_plan: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"remedy": self.remedy, "recommendation_id": self.recommendation_id,
                               "params": to_json(self.params), "at_step": self.at_step}
        if self.measure_steps is not None:
            out["measure_steps"] = self.measure_steps
        if self.before is not None:
            out["before"] = self.before.to_dict()
        if self.from_plan:
            out["from_plan"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ApplyStarted":
        known = known_fields(cls, data)
        if known.get("before") is not None:
            known["before"] = Measurement.from_dict(known["before"])
        return cls(**known)
