"""The outcome of applying one remedy: predicted against measured, and what was decided.

Pure standard library: the executor builds them in the training process, they travel as event
payloads (``result.event(rank=, step=)``: ``apply_started``, ``apply_result``, ``apply_reverted``)
and the controller decodes them, checked (``Payload.of``), into ``SessionState.applied``: the apply
history, in arrival order, of ``ApplyResult``s (kept, reverted after their window, or failed) and
``RevertResult``s (a kept remedy the user reverted later). ``ApplyHistory`` names that union; the
report's ``applied`` section is each entry's ``as_history()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Mapping, Union

from advisor.records.jsonable import decode, to_json
from advisor.records.payload import Payload

# "interrupted": the job ended (SIGTERM, SIGKILL, the script's own end) while the remedy was in
# force and before its measurement window completed, so nothing was decided; its measurements
# hold what was seen. Neither "kept" (it was not judged) nor absent (it ran).
Status = Literal["kept", "reverted", "failed", "interrupted"]
STATUSES: tuple[str, ...] = ("kept", "reverted", "failed", "interrupted")


def rebase_step_time(before_s: float | None, predicted_s: float | None, baseline_s: float | None) -> float | None:
    """``predicted_s``, made against a step of ``baseline_s``, rebased onto a measured step of
    ``before_s``: before x predicted / baseline; None unless all three are positive."""
    if not (before_s and predicted_s and baseline_s) or min(before_s, predicted_s, baseline_s) <= 0:
        return None
    return before_s * predicted_s / baseline_s


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """Peak memory and step time over a window of steps (None where not measured).

    ``peak_memory_bytes``: the highest ``StepSample.peak_memory_bytes`` (the
    allocator peak of deep-sampled steps, ``torch.cuda.max_memory_allocated``)
    in the window, bytes. ``step_time_s``: the mean ``StepSample.time_s`` of ``time_steps``
    (wall clock between optimizer-step boundaries; on CUDA the device's time), seconds: a
    window's mean is the job's throughput (docs/report-schema.md).
    """

    peak_memory_bytes: int | None = None
    step_time_s: float | None = None
    steps: tuple[int, ...] = ()  # the StepSample indexes the figures come from
    time_steps: tuple[int, ...] = ()  # the steps ``step_time_s`` is the mean of
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
        return decode(cls, data or {})


@dataclass(frozen=True, kw_only=True)
class ApplyResult(Payload):
    """One remedy applied (or attempted) at a step boundary of one rank: the ``apply_result`` event."""

    NAME: ClassVar[str] = "apply_result"
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
    # The step time ``predicted`` was made against (the recommendation's baseline), seconds.
    baseline_step_time_s: float | None = None

    @property
    def rebased_step_time_s(self) -> float | None:
        """The prediction's change rebased onto the before window: ``before`` x predicted /
        baseline, the reference the keep/revert limit reads (``apply.executor.decide``). The job's
        own speed moves between the steps a prediction is made on and the apply (a job still
        warming up, another process on the cores); the remedy's predicted change does not."""
        return rebase_step_time(self.before.step_time_s, self.predicted.step_time_s, self.baseline_step_time_s)

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
                "baseline_step_time_s": to_json(self.baseline_step_time_s),
                "rebased_step_time_s": to_json(self.rebased_step_time_s),
            },
            "measured": {"before": self.before.to_dict(), "after": self.after.to_dict()},
            "status": self.status,
            "error": self.error,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ApplyResult":
        """The checked record of the wire shape ``to_dict`` writes (``measured.before/after``)."""
        measured = data.get("measured") if isinstance(data, Mapping) else None
        if measured is not None and not isinstance(measured, Mapping):
            raise ValueError(f"ApplyResult.measured: expected an object, got {type(measured).__name__}")
        flat = {k: v for k, v in data.items() if k != "measured"}
        for key in ("before", "after"):
            if measured and measured.get(key) is not None:
                flat[key] = measured[key]
        predicted = data.get("predicted")
        if isinstance(predicted, Mapping) and predicted.get("baseline_step_time_s") is not None:
            flat["baseline_step_time_s"] = predicted["baseline_step_time_s"]
        return decode(cls, flat)

    def as_history(self) -> dict[str, Any]:
        """The report's ``applied`` entry."""
        return self.to_dict()


@dataclass(frozen=True, kw_only=True)
class RevertResult(Payload):
    """A kept remedy reverted later on the user's request, at a step boundary of one rank: the
    ``apply_reverted`` event. Its history entry says status "reverted" (and has no ``measured``,
    unlike an ``ApplyResult`` reverted after its measurement window).
    """

    NAME: ClassVar[str] = "apply_reverted"
    status: ClassVar[Status] = "reverted"
    remedy: str
    recommendation_id: str | None = None
    at_step: int | None = None  # first step that ran without the remedy
    reason: str = "reverted on request"

    def as_history(self) -> dict[str, Any]:
        """The report's ``applied`` entry: the event's data with its status."""
        return {**self.to_dict(), "status": self.status}


ApplyHistory = Union[ApplyResult, RevertResult]  # one entry of ``SessionState.applied``


@dataclass(frozen=True, kw_only=True)
class ApplyStarted(Payload):
    """A remedy applied at a step boundary (by a command, or by a plan before step 0); measuring
    follows: the ``apply_started`` event. The optional keys keep the two senders' shapes: the
    executor adds ``measure_steps``, ``before`` and ``digest``, a plan adds ``from_plan: true``.
    """

    NAME: ClassVar[str] = "apply_started"
    remedy: str
    recommendation_id: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    at_step: int | None = None
    measure_steps: int | None = None
    before: Measurement | None = None
    digest: str | None = None
    from_plan: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"remedy": self.remedy, "recommendation_id": self.recommendation_id,
                               "params": to_json(self.params), "at_step": self.at_step}
        if self.measure_steps is not None:
            out["measure_steps"] = self.measure_steps
        if self.before is not None:
            out["before"] = self.before.to_dict()
        if self.digest is not None:
            out["digest"] = self.digest
        if self.from_plan:
            out["from_plan"] = True
        return out
