"""The controller's live view of a session, read by the TUI and the headless printer.

The session's receiver thread folds each incoming record into a
``SessionState`` under a lock; readers take ``snapshot()`` copies, so the UI
never sees a half-updated state and never blocks the receiver for long.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from advisor.records.advice import Diagnosis, Recommendation
from advisor.records.results import ApplyHistory, ApplyResult, RevertResult
from advisor.records.samples import (
    CollectiveStat,
    Event,
    ExitInfo,
    MemorySample,
    ModelInfo,
    ModuleStat,
    OpStat,
    OptimizerInfo,
    Record,
    RecordTable,
    RunInfo,
    StepSample,
)
from advisor.step_totals import StepTotals

# Step records kept per rank in memory (the live view, the report's step list); the store keeps
# every step, and ``step_totals`` sums every step for the summary, so nothing is silently cut.
MAX_LIVE_STEPS = 5000
# Other records kept per kind (memory samples, module and op stats, collectives, events): a long
# run's oldest are let go, counted in ``records_dropped``; the store keeps them all.
MAX_LIVE_RECORDS = 200_000
# The script's output lines kept for the TUI (the newest); output.log in the session folder has all.
OUTPUT_KEEP = 1000


@dataclass(frozen=True, kw_only=True)
class PendingApply:
    """An apply the controller sent whose result has not come back yet."""

    recommendation_id: str
    requested_at: float  # time.time() when it was sent
    at_step: int | None = None  # the boundary it was sent for


@dataclass
class SessionState:
    """Everything the UI shows; plain data, cheap to copy."""

    session_id: str = ""
    session_path: str = ""
    runs: dict[int, RunInfo] = field(default_factory=dict)
    models: list[ModelInfo] = field(default_factory=list)
    optimizers: list[OptimizerInfo] = field(default_factory=list)
    steps: dict[int, list[StepSample]] = field(default_factory=dict)  # rank -> the last MAX_LIVE_STEPS samples
    step_totals: dict[int, StepTotals] = field(default_factory=dict)  # rank -> figures over every step
    exits: dict[int, ExitInfo] = field(default_factory=dict)
    records_dropped: dict[str, int] = field(default_factory=dict)  # kind -> oldest let go past MAX_LIVE_RECORDS
    events: list[Event] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    modules: list[ModuleStat] = field(default_factory=list)
    ops: list[OpStat] = field(default_factory=list)
    collectives: list[CollectiveStat] = field(default_factory=list)
    # Filled by the controller from recommend/ (advisor.advice.advise_state).
    diagnosis: Diagnosis | None = None
    recommendations: list[Recommendation] = field(default_factory=list)
    # The apply history in arrival order (advisor/regime.py reads it; advisor.records.results).
    applied: list[ApplyHistory] = field(default_factory=list)
    pending_apply: PendingApply | None = None
    job: dict[str, Any] | None = None  # the multi-node job this session belongs to (advisor/controller.py)
    finished: bool = False
    exit_code: int | None = None
    exit_reason: str = ""
    output_tail: list[str] = field(default_factory=list)  # the script's last OUTPUT_KEEP output lines (TUI mode)
    output_lines: int = 0  # every output line seen, so a reader knows which of the tail are new

    @property
    def world_size(self) -> int:
        sizes = [r.world_size for r in self.runs.values()]
        return max(sizes) if sizes else 1

    def latest_step(self) -> int:
        """Highest step index seen on any rank, or -1."""
        return max((s[-1].index for s in self.steps.values() if s), default=-1)

    def step_all_ranks_reached(self) -> int:
        """The highest step index every rank with steps has sent, or -1."""
        return min((s[-1].index for s in self.steps.values() if s), default=-1)

    def rank0_steps(self) -> list[StepSample]:
        if not self.steps:
            return []
        return self.steps.get(0) or self.steps[min(self.steps)]


class LiveState:
    """Thread-safe holder of a ``SessionState`` fed record by record."""

    def __init__(self, session_id: str = "", session_path: str = "") -> None:
        self._lock = threading.Lock()
        self._state = SessionState(session_id=session_id, session_path=session_path)
        self.version = 0  # bumped on every change, so pollers can skip redraws

    def add(self, record: Record) -> None:
        with self._lock:
            _fold(self._state, record)
            self.version += 1

    def update(self, **changes: Any) -> None:
        with self._lock:
            for key, value in changes.items():
                setattr(self._state, key, value)
            self.version += 1

    def append_output(self, line: str, keep: int = OUTPUT_KEEP) -> None:
        """One line of the script's output (advisor/output_tail.py follows output.log)."""
        with self._lock:
            tail = self._state.output_tail
            tail.append(line)
            del tail[:-keep]
            self._state.output_lines += 1
            self.version += 1

    def snapshot(self) -> SessionState:
        return self.versioned_snapshot()[1]

    def versioned_snapshot(self) -> tuple[int, SessionState]:
        """The state and its version, read together."""
        with self._lock:
            return self.version, copy.copy(_shallow_lists(self._state))


def _shallow_lists(state: SessionState) -> SessionState:
    """Copy the containers (not the frozen records inside) so readers see a stable view."""
    out = copy.copy(state)
    for name, value in vars(state).items():
        if isinstance(value, list):
            setattr(out, name, list(value))
        elif isinstance(value, dict):
            setattr(out, name, {k: (list(v) if isinstance(v, list) else v) for k, v in value.items()})
    return out


def _fold(state: SessionState, record: Record) -> None:
    if isinstance(record, RecordTable):  # a deep step's samples or ops as columns: the records they stand for
        for row in record.records():
            _fold(state, row)
        return
    if isinstance(record, StepSample):
        samples = state.steps.setdefault(record.rank, [])
        samples.append(record)
        totals = state.step_totals.get(record.rank)
        if totals is None:
            totals = state.step_totals[record.rank] = StepTotals()
        totals.add(record.index, record.time_s, record.deep, record.loss, record.phases)
        if len(samples) > MAX_LIVE_STEPS:
            del samples[: len(samples) - MAX_LIVE_STEPS]
    elif isinstance(record, RunInfo):
        state.runs[record.rank] = record
    elif isinstance(record, ExitInfo):
        state.exits[record.rank] = record
    elif isinstance(record, ModelInfo):
        state.models.append(record)
    elif isinstance(record, OptimizerInfo):
        state.optimizers.append(record)
    elif isinstance(record, MemorySample):
        _append_capped(state, "memory", state.memory, record)
    elif isinstance(record, ModuleStat):
        _append_capped(state, "module", state.modules, record)
    elif isinstance(record, OpStat):
        _append_capped(state, "op", state.ops, record)
    elif isinstance(record, CollectiveStat):
        _append_capped(state, "collective", state.collectives, record)
    elif isinstance(record, Event):
        _append_capped(state, "event", state.events, record)
        if record.name == ApplyResult.NAME:
            state.applied.append(ApplyResult.of(record))
            state.pending_apply = None
        elif record.name == RevertResult.NAME:  # a kept remedy reverted later, on the user's request
            state.applied.append(RevertResult.of(record))


def _append_capped(state: SessionState, kind: str, records: list, record: Record) -> None:
    records.append(record)
    if len(records) > MAX_LIVE_RECORDS:
        drop = MAX_LIVE_RECORDS // 10  # in chunks, so the cost per record stays constant
        del records[:drop]
        state.records_dropped[kind] = state.records_dropped.get(kind, 0) + drop


class Source(Protocol):
    """What the TUI talks to: a live session, or a fake in tests."""

    def snapshot(self) -> SessionState:
        """A consistent copy of the state now."""

    def apply(self, recommendation_id: str, *, confirmed: bool = False) -> str | None:
        """Ask the training job to apply a recommendation; returns an error text or None."""

    def revert(self) -> str | None:
        """Ask the training job to revert the last applied remedy; returns an error text or None."""

    def stop(self) -> None:
        """The user quit the UI: stop following (training goes on unless the user asked to stop it)."""
