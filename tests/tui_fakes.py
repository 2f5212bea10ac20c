"""A fake ``Source`` for the TUI tests: a ``LiveState`` the test feeds, plus a log of calls.

Pure standard library and advisor/probes records: no torch, so TUI tests start fast.
"""

from __future__ import annotations

import threading
from typing import Any

from advisor.records.advice import CurvePoint, Diagnosis, Evidence, Prediction, Recommendation
from advisor.records.results import ApplyResult, Measurement
from advisor.records.samples import ExitInfo, StepSample
from advisor.state import LiveState, PendingApply, SessionState


class FakeSource:
    """Implements ``advisor.state.Source`` over a ``LiveState``; the test plays the training job."""

    def __init__(self, live: LiveState | None = None) -> None:
        self.live = live or LiveState(session_id="test-session")
        self.calls: list[tuple[str, ...]] = []
        self.apply_error: str | None = None  # what apply() returns
        self.revert_error: str | None = None
        self.apply_raises: Exception | None = None
        self.snapshot_raises: Exception | None = None
        # When set, apply() waits on it: lets a test see the UI while the call blocks.
        self.apply_gate: threading.Event | None = None

    @property
    def version(self) -> int:
        return self.live.version

    # ----- Source -----

    def snapshot(self) -> SessionState:
        if self.snapshot_raises is not None:
            raise self.snapshot_raises
        return self.live.snapshot()

    def apply(self, recommendation_id: str, *, confirmed: bool = False) -> str | None:
        self.calls.append(("apply", recommendation_id) + (("confirmed",) if confirmed else ()))
        if self.apply_gate is not None:
            self.apply_gate.wait(5)
        if self.apply_raises is not None:
            raise self.apply_raises
        if self.apply_error is None:
            self.live.update(pending_apply=PendingApply(recommendation_id=recommendation_id, requested_at=0.0))
        return self.apply_error

    def revert(self) -> str | None:
        self.calls.append(("revert",))
        return self.revert_error

    def stop(self) -> None:
        self.calls.append(("stop",))

    # ----- the test plays the training job with these -----

    def add_steps(self, count: int, *, start: int | None = None, time_s: float = 0.1, rank: int = 0) -> None:
        first = self.live.snapshot().latest_step() + 1 if start is None else start
        for index in range(first, first + count):
            self.live.add(
                StepSample(
                    index=index,
                    rank=rank,
                    time_s=time_s + 0.001 * index,
                    loss=2.0 / (index + 1),
                    phases={
                        "data_s": 0.01,
                        "forward_s": 0.03,
                        "backward_s": 0.05,
                        "optimizer_s": 0.01,
                        "other_s": time_s - 0.1 + 0.001 * index,
                    },
                    peak_memory_bytes=3 * 1024**3,
                )
            )

    def advise(self, recommendations: list[Recommendation], diagnosis: Diagnosis | None = None) -> None:
        self.live.update(recommendations=recommendations, diagnosis=diagnosis or DIAGNOSIS)

    def finish_apply(self, result: ApplyResult) -> None:
        """What the receiver does when the agent reports an apply result."""
        self.live.add(result.event(step=result.at_step))

    def end(self, *, code: int = 0, reason: str = "completed", exits: list[ExitInfo] | None = None) -> None:
        for info in exits or []:
            self.live.add(info)
        self.live.update(finished=True, exit_code=code, exit_reason=reason)


DIAGNOSIS = Diagnosis(
    bottleneck="memory",
    summary="peak memory is 94% of the device",
    evidence=(
        Evidence(what="peak memory", value=94, threshold=90, unit="%"),
        Evidence(what="activations", value="2.1 GiB"),
    ),
)


def recommendation(
    rec_id: str = "ac-1",
    *,
    remedy: str = "activation_checkpointing",
    title: str = "Checkpoint 4 transformer blocks",
    live: bool = True,
    curve: list[CurvePoint] | None = None,
    **changes: Any,
) -> Recommendation:
    fields: dict[str, Any] = dict(
        id=rec_id,
        remedy=remedy,
        title=title,
        params={"modules": ["layers.0", "layers.1", "layers.2", "layers.3"]},
        predicted=Prediction(peak_memory_bytes=2 * 1024**3, step_time_s=0.12),
        baseline=Prediction(peak_memory_bytes=3 * 1024**3, step_time_s=0.10),
        budget_bytes=4 * 1024**3,
        exact=True,
        live=live,
        confidence="high",
        cost_model="recompute forward of checkpointed blocks",
        prerequisites=["model is an nn.Module"],
        evidence=["activations are 70% of peak memory", "forward is 30% of step time"],
        curve=curve or [],
    )
    return Recommendation(**{**fields, **changes})


def applied(
    rec_id: str = "ac-1",
    *,
    status: str = "kept",
    error: str | None = None,
    reason: str | None = None,
    at_step: int = 12,
) -> ApplyResult:
    before = Measurement(peak_memory_bytes=3 * 1024**3, step_time_s=0.10)
    after = Measurement(peak_memory_bytes=int(2.1 * 1024**3), step_time_s=0.125)
    return ApplyResult(remedy="activation_checkpointing", recommendation_id=rec_id, at_step=at_step,
                       predicted=Measurement(peak_memory_bytes=2 * 1024**3, step_time_s=0.12), before=before,
                       after=after if status != "failed" else Measurement(), status=status, error=error,
                       reason=reason or "")
