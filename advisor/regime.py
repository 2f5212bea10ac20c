"""Which remedies are in force, and the part of a session measured under them.

One headless place for the rules the TUI and the advice loop share: the stack
of remedies in force (kept, and not reverted since), when an apply or a revert
must be refused, and the "current regime" (the steps run with the job's
configuration as it is now), which advice describes.

``SessionState.applied`` holds, in arrival order, every ``ApplyResult`` (status kept,
reverted, failed or interrupted) and, for a user revert of a kept remedy, its ``RevertResult``.
An "interrupted" remedy was in force when the job ended, undecided: it counts as in force, as a
kept one does.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

from advisor.records.advice import Recommendation
from advisor.records.events import payloads
from advisor.records.results import ApplyHistory, ApplyResult, ApplyStarted, Measurement, RevertResult
from advisor.records.samples import Event
from advisor.state import SessionState

IN_FORCE = ("kept", "interrupted")  # statuses of a remedy the job ran with from its at_step on


def in_force(applied: Sequence[ApplyHistory]) -> list[ApplyResult]:
    """The remedies in force now, oldest first: kept, and not reverted since (remedies stack)."""
    stack: list[ApplyResult] = []
    for result in applied:
        if isinstance(result, ApplyResult) and result.status in IN_FORCE:
            stack.append(result)
        elif result.status == "reverted":  # a user revert, or a result reverted after its window
            for i in range(len(stack) - 1, -1, -1):
                if stack[i].recommendation_id == result.recommendation_id:
                    del stack[i]
                    break
    return stack


def last_kept(applied: Sequence[ApplyHistory]) -> ApplyResult | None:
    """The most recent remedy still in force (the one a revert undoes), or None."""
    stack = in_force(applied)
    return stack[-1] if stack else None


def apply_refusal(state: SessionState, rec: Recommendation | None, *, in_flight: bool = False) -> str | None:
    """Why ``rec`` cannot be applied now (one sentence for the user), or None.

    ``in_flight``: the caller knows of an apply or revert it sent that has not come back yet.
    """
    if rec is None:
        return "No recommendation to apply yet."
    title = rec.title or rec.remedy or rec.id
    if state.finished:
        return "Training has ended: there is no running job to apply a remedy to."
    if not rec.applicable:
        return f"{title} cannot apply to this job: {rec.why}"
    if not rec.live:
        return f"{title} cannot be applied to a running job: it needs a restart (see its evidence, Enter)."
    if in_flight or state.pending_apply:
        return "An apply is already in flight; wait for its result."
    return None


def inexact_refusal(rec: Recommendation, *, allowed: bool) -> str | None:
    """A live-opt-in remedy changes numerics: refused unless the user allowed it
    (``--allow-inexact`` headless, or the TUI's confirmation)."""
    if rec.apply_class == "live-opt-in" and not allowed:
        return (f"{rec.id} changes numerics (apply class live-opt-in); "
                "pass --allow-inexact to `advisor attach`, or confirm it in the TUI")
    return None


def revert_refusal(state: SessionState, *, in_flight: bool = False) -> str | None:
    """Why a revert cannot be sent now (one sentence for the user), or None."""
    if state.finished:
        return "Training has ended: nothing to revert."
    if last_kept(state.applied) is None:
        return "Nothing to revert: no remedy is in force."
    if in_flight or state.pending_apply:
        return "Wait for the change in flight to finish before reverting."
    return None


def regime_start(applied: Sequence[ApplyHistory]) -> int | None:
    """The first step run with the job's configuration as it is now; None if it never changed.

    A kept remedy changes it at its ``at_step``; a user revert at the revert's ``at_step``;
    a remedy reverted after its measurement window, at the step after that window. A failed
    apply is undone at the boundary it was tried at and changes nothing.
    """
    changes = [step for step in (_changed_at(a) for a in applied) if step is not None]
    return max(changes) if changes else None


def first_change(applied: Sequence[ApplyHistory]) -> int | None:
    """The first step that ran under any remedy (kept or later reverted); None if none ever did."""
    starts = [a.at_step for a in applied
              if isinstance(a, ApplyResult) and a.status in (*IN_FORCE, "reverted") and a.at_step is not None]
    return min(starts) if starts else None


def current_regime(state: SessionState) -> SessionState:
    """The part of a session measured with the job's configuration as it is now.

    Advice must describe the job as it is: after a kept checkpointing plan the old peak
    no longer exists, and after that plan is reverted its lower peak no longer does. When
    nothing was measured yet since the last change, a job with no remedy in force falls
    back to the steps before the first remedy (the same configuration), and otherwise to
    the whole session.
    """
    since = regime_start(state.applied)
    if since is None:
        return state
    regime = _window(state, lambda step: step >= since)
    if _measured(regime):
        return regime
    first = first_change(state.applied)
    if not in_force(state.applied) and first is not None:
        baseline = _window(state, lambda step: step < first)
        if _measured(baseline):
            return baseline
    return state


def _window(state: SessionState, keep: Any) -> SessionState:
    out = copy.copy(state)
    out.steps = {r: [s for s in samples if keep(s.index)] for r, samples in state.steps.items()}
    out.memory = [m for m in state.memory if keep(m.step)]
    out.modules = [m for m in state.modules if keep(m.step)]
    out.ops = [o for o in state.ops if keep(o.step)]
    out.collectives = [c for c in state.collectives if keep(c.step)]
    out.events = [e for e in state.events if e.step is None or keep(e.step)]
    return out


def _measured(state: SessionState) -> bool:
    return bool(state.modules) and any(s.deep for samples in state.steps.values() for s in samples)


def _changed_at(entry: ApplyHistory) -> int | None:
    if entry.at_step is None or entry.status not in (*IN_FORCE, "reverted"):
        return None
    if isinstance(entry, RevertResult):  # a user's revert: the job changed where it was undone
        return entry.at_step
    if entry.status == "reverted":  # reverted after its window: changed back after the window
        window = entry.after.steps
        return max(window) + 1 if window else entry.at_step
    return entry.at_step


def interrupted_applies(state: SessionState) -> list[Event]:
    """An ``apply_result`` event, status "interrupted", for each apply a rank started
    (``apply_started``) and never reported on: the job was killed (SIGKILL, the OOM killer) inside
    the measurement window, so the agent's executor never closed it. Each carries what was
    measured: the rank's steps from ``at_step`` on (peak memory, mean time of its light steps
    after the first), and the "before" the rank sent when it applied."""
    reported = {(e.rank, r.remedy, r.at_step) for e, r in payloads(state.events, ApplyResult)}
    out = []
    for event, started in payloads(state.events, ApplyStarted):
        if (event.rank, started.remedy, started.at_step) in reported:
            continue
        at_step = started.at_step
        after = [s for s in state.steps.get(event.rank, []) if at_step is not None and s.index >= at_step]
        timed = [s for s in after[1:] if not s.deep]
        peaks = [s for s in after if s.peak_memory_bytes is not None]
        measured = Measurement(
            peak_memory_bytes=max((s.peak_memory_bytes for s in peaks), default=None),  # type: ignore[type-var]
            step_time_s=sum(s.time_s for s in timed) / len(timed) if timed else None,
            steps=tuple(s.index for s in after), time_steps=tuple(s.index for s in timed),
            peak_steps=tuple(s.index for s in peaks), step_kind="light" if timed else None)
        result = ApplyResult(
            remedy=started.remedy, recommendation_id=started.recommendation_id, params=dict(started.params),
            rank=event.rank, at_step=at_step, before=started.before or Measurement(), after=measured,
            status="interrupted",
            reason=f"the training process ended without reporting on it (killed) {len(after)} step(s) into "
                   "its measurement window; the figures are the steps it sent")
        out.append(result.event(rank=event.rank, step=event.step))
    return out
