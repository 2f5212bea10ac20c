"""What every TUI view reads: one ``ViewModel`` per (session state, rank, budget).

Built from a ``SessionState``, whether it came from a live session (``LiveState.snapshot``)
or a recorded one (``advisor.store.load_state``), so the views never touch SQLite or the
socket. The figures are the report's own (``advisor/sections``, ``advise_state``), computed
on the chosen rank's records only, so the TUI and ``advisor report`` agree. No textual, no
rich, no torch here: the model is plain data, tested without an app.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass, field
from typing import Any

from advisor.advice import advise_state, recorded_budget
from advisor.records.samples import Event, StepSample, ordinary_steps
from advisor.records.advice import Diagnosis, Recommendation
from advisor.records.results import ApplyHistory, ApplyResult
from advisor.regime import in_force, regime_start
from advisor.sections.comm import build_collectives_section, build_comm_section, build_straggler_section
from advisor.sections.compute import build_compute_section, build_ops_section, device_spec_from_state
from advisor.sections.memory import build_memory_section
from advisor.sections.regimes import build_regimes_section, slice_state
from advisor.state import SessionState
from advisor.tui.traced_step import TracedStep, traced_step

RECENT_STEPS = 40  # steps drawn in the overview's phase bars and loss sparkline

# Event names that are news for the events log; the others (device_spec, collective_seq, ...)
# are bookkeeping that other views read.
_NEWS = frozenset({"warning", "oom", "apply_started", "apply_result", "apply_reverted", "deep_sampling_stopped",
                    "deep_probes_left_off"})


@dataclass(frozen=True, kw_only=True)
class RankRow:
    """One rank's line on the ranks view (seconds, bytes)."""

    rank: int
    steps: int
    # Both over the steps since the last remedy changed the job, when any (ViewModel.regime_since):
    median_step_s: float | None  # median StepSample.time_s over steady steps (index > 0, not deep)
    peak_bytes: int | None  # highest StepSample.peak_memory_bytes, else MemorySample.total_bytes
    last_loss: float | None
    exposed_comm_s: float | None  # per step, from the report's comm section
    exit: str | None  # how the rank ended, when it has


@dataclass(frozen=True, kw_only=True)
class EventRow:
    """One line of the events view."""

    step: int | None
    rank: int | None
    kind: str  # warning, oom, apply, revert, probe, exit, ...
    text: str


@dataclass(frozen=True, kw_only=True)
class ViewModel:
    """Everything the views show for one rank of one session."""

    session_id: str
    script: str | None
    device: dict[str, Any]
    world_size: int
    ranks: list[RankRow]
    rank: int  # the rank the views show
    slowest_rank: int | None
    budget_bytes: int | None
    live: bool  # a running job (apply, revert and stop make sense)
    finished: bool
    exit_code: int | None
    exit_reason: str
    diagnosis: Diagnosis | None
    recommendations: list[Recommendation]
    applied: list[ApplyHistory]
    in_force: list[ApplyResult]
    steps: list[StepSample]  # the rank's last RECENT_STEPS steps
    deep_steps: list[int]  # indexes of the rank's deep-sampled steps (every one kept in memory)
    memory: dict[str, Any]  # the report's memory section, for this rank
    ops: list[dict[str, Any]]  # the report's ops section, for this rank
    compute: dict[str, Any]  # the report's compute section, for this rank
    collectives: list[dict[str, Any]]  # the report's collectives rows, every rank
    comm: list[dict[str, Any]]  # per-rank comm rows
    straggler: dict[str, Any] | None
    events: list[EventRow]
    traced: TracedStep | None = None  # the latest step the memory probe traced on this rank
    # After a remedy changed the job (kept, or reverted later): the step the job as it is now
    # started at, and the memory section of this rank over those steps only (the budget share,
    # the peak and the modules the job has now); None while nothing changed.
    regime_since: int | None = None
    memory_now: dict[str, Any] | None = None
    regimes: list[dict[str, Any]] = field(default_factory=list)  # the report's regimes, this rank

    @property
    def peak_flops(self) -> float | None:
        """The roof for the dominant dtype (``device_spec`` event ``peak_flops``, FLOP/s)."""
        peaks = self.device.get("peak_flops") or {}
        if not isinstance(peaks, dict) or not peaks:
            return None
        dtype = self.compute.get("dominant_dtype")
        return float(peaks.get(dtype) or max(peaks.values()))

    @property
    def memory_bandwidth(self) -> float | None:
        """``device_spec`` event ``memory_bandwidth``, bytes/s."""
        value = self.device.get("memory_bandwidth")
        return float(value) if value else None


def rank_state(state: SessionState, rank: int) -> SessionState:
    """``state`` with only ``rank``'s per-rank records (steps, memory, modules, ops, events);
    runs, exits and collectives stay whole (the section builders compare ranks with them)."""
    out = copy.copy(state)
    out.steps = {rank: list(state.steps.get(rank, []))}
    out.step_totals = {rank: state.step_totals[rank]} if rank in state.step_totals else {}
    out.memory = [m for m in state.memory if m.rank == rank]
    out.modules = [m for m in state.modules if m.rank == rank]
    out.ops = [o for o in state.ops if o.rank == rank]
    out.events = [e for e in state.events if e.rank == rank or e.name == "device_spec"]
    return out


def rank_rows(state: SessionState, comm: list[dict[str, Any]], since: int | None = None) -> list[RankRow]:
    """One row per rank. ``since``: the step the job as it is now started at (a remedy changed it):
    the median step time and the peak are of the steps from there, when any was measured."""
    ranks = sorted(set(state.steps) | set(state.runs) | set(state.exits))
    exposed = {int(row["rank"]): row.get("exposed_s") for row in comm if "rank" in row}
    first = since if since is not None else -1
    rows = []
    for rank in ranks:
        samples = state.steps.get(rank, [])
        now = [s for s in samples if s.index >= first] or samples
        steady = ordinary_steps(now)
        peaks = [s.peak_memory_bytes for s in now if s.peak_memory_bytes is not None]
        if not peaks:
            memory = [m.total_bytes for m in state.memory if m.rank == rank]
            peaks = [m.total_bytes for m in state.memory if m.rank == rank and m.step >= first] or memory
        losses = [s.loss for s in samples if s.loss is not None]
        info = state.exits.get(rank)
        rows.append(RankRow(
            rank=rank, steps=len(samples),
            median_step_s=statistics.median(s.time_s for s in steady) if steady else None,
            peak_bytes=max(peaks) if peaks else None, last_loss=losses[-1] if losses else None,
            exposed_comm_s=exposed.get(rank),
            exit=None if info is None else (info.reason or f"exit code {info.code}")))
    return rows


def slowest(rows: list[RankRow]) -> int | None:
    """The rank with the highest median step time (ties: the lowest rank), or None."""
    timed = [r for r in rows if r.median_step_s is not None]
    if not timed:
        return min((r.rank for r in rows), default=None)
    return min(timed, key=lambda r: (-r.median_step_s, r.rank)).rank  # type: ignore[operator]


def event_rows(state: SessionState) -> list[EventRow]:
    """Warnings, disabled probes, OOMs, applies, reverts and rank exits, in arrival order."""
    rows = [row for e in state.events if (row := _event_row(e)) is not None]
    for rank, info in sorted(state.exits.items()):
        what = f"{info.exc_type}: {info.message}" if info.exc_type else (info.reason or "exited")
        rows.append(EventRow(step=None, rank=rank, kind="exit", text=f"{what} (exit code {info.code})"))
    return rows


def _event_row(event: Event) -> EventRow | None:
    if event.name not in _NEWS:
        return None
    data = event.data
    if event.name == "warning":
        message = str(data.get("message", ""))
        kind = "probe" if message.startswith("probe ") and " disabled" in message else "warning"
        text = message
    elif event.name == "oom":
        kind = "oom"
        text = f"out of memory in {data.get('op') or '?'}" + (f" ({data['message']})" if data.get("message") else "")
    elif event.name == "apply_result":
        kind, text = "apply", f"{data.get('remedy') or data.get('recommendation_id')}: {data.get('status')}"
        if data.get("error"):
            text += f" ({data['error']})"
    elif event.name == "apply_started":
        kind, text = "apply", f"{data.get('remedy') or data.get('recommendation_id')}: applying"
    elif event.name == "apply_reverted":
        kind, text = "revert", f"{data.get('remedy') or data.get('recommendation_id')} reverted"
    else:
        kind = event.name
        text = ", ".join(f"{k}={v}" for k, v in list(data.items())[:4]) if data else event.name
    return EventRow(step=event.step, rank=event.rank, kind=kind, text=text)


def advice_budget(state: SessionState, budget_bytes: int | None = None) -> int | None:
    """The memory budget advice is computed at, as ``advisor report`` computes it: the one asked
    for, else the recorded ``--memory-budget``, else the device's memory (rank 0's run)."""
    budget = budget_bytes or recorded_budget(state)
    run = state.runs.get(0) or (state.runs[min(state.runs)] if state.runs else None)
    if not budget and run is not None and run.device.get("memory_capacity"):
        budget = int(run.device["memory_capacity"])
    return budget


def build_view_model(state: SessionState, *, rank: int | None = None, budget_bytes: int | None = None,
                     live: bool = False, readvise: bool = False) -> ViewModel:
    """The model for ``rank`` (default: the slowest rank).

    ``readvise``: compute the diagnosis and recommendations here with ``advise_state`` at
    ``budget_bytes`` (a recorded session, or a new budget); otherwise the state's own (the live
    advice loop's, or those the session saved). It can take a while: call it from a worker.
    """
    comm = build_comm_section(state)
    since = regime_start(state.applied)
    rows = rank_rows(state, comm, since)
    worst = slowest(rows)
    known = {r.rank for r in rows}
    chosen = rank if rank is not None and (rank in known or not known) else (worst if worst is not None else 0)
    budget = advice_budget(state, budget_bytes)
    spec = device_spec_from_state(state) or {}
    run = state.runs.get(chosen) or state.runs.get(0) or next(iter(state.runs.values()), None)
    device = dict(run.device) if run else {}
    device.update({k: v for k, v in spec.items() if v is not None})
    if not budget and device.get("memory_capacity"):
        budget = int(device["memory_capacity"])  # the report's documented default
    mine = rank_state(state, chosen)
    # The job as it is now: this rank's steps since the last change (none measured yet: no figures).
    now = slice_state(mine, since, None) if since is not None else None
    if now is not None and not now.memory:
        now = None
    diagnosis, recommendations = state.diagnosis, list(state.recommendations)
    if readvise or (diagnosis is None and not recommendations and state.finished):
        diagnosis, recommendations = advise_state(state, budget_bytes=budget)
    return ViewModel(
        session_id=state.session_id, script=run.script if run else None, device=device,
        world_size=state.world_size, ranks=rows, rank=chosen, slowest_rank=worst, budget_bytes=budget,
        live=live and not state.finished, finished=state.finished, exit_code=state.exit_code,
        exit_reason=state.exit_reason, diagnosis=diagnosis, recommendations=recommendations,
        applied=list(state.applied), in_force=in_force(state.applied),
        steps=list(state.steps.get(chosen, []))[-RECENT_STEPS:],
        deep_steps=[s.index for s in state.steps.get(chosen, []) if s.deep],
        memory=build_memory_section(mine, budget_bytes=budget), ops=build_ops_section(mine, spec),
        compute=build_compute_section(mine, spec), collectives=build_collectives_section(state), comm=comm,
        straggler=build_straggler_section(state), events=event_rows(state),
        traced=traced_step(mine.steps.get(chosen, []), mine.memory, chosen),
        regime_since=since, memory_now=build_memory_section(now, budget_bytes=budget) if now is not None else None,
        regimes=build_regimes_section(mine, spec) if since is not None else [],
    )
