"""Which remedies are in force, and the part of a session measured under them.

One headless place for the rules the TUI and the advice loop share: the stack
of remedies in force (kept, and not reverted since), when an apply or a revert
must be refused, and the "current regime" (the steps run with the job's
configuration as it is now), which advice describes.

``SessionState.applied`` holds, in arrival order, every ``ApplyResult.to_dict()``
(status kept, reverted, failed or interrupted) and, for a user revert of a kept remedy, the
``apply_reverted`` event's data with status "reverted" (no ``measured`` key). An "interrupted"
remedy was in force when the job ended, undecided: it counts as in force, as a kept one does.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

from advisor.records.results import ApplyResult, Measurement
from advisor.records.samples import Event
from advisor.state import SessionState

IN_FORCE = ("kept", "interrupted")  # statuses of a remedy the job ran with from its at_step on


def in_force(applied: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The remedies in force now, oldest first: kept, and not reverted since (remedies stack)."""
    stack: list[dict[str, Any]] = []
    for result in applied:
        status = result.get("status")
        if status in IN_FORCE:
            stack.append(dict(result))
        elif status == "reverted":  # a user revert, or a result reverted after its window
            rec_id = result.get("recommendation_id")
            for i in range(len(stack) - 1, -1, -1):
                if stack[i].get("recommendation_id") == rec_id:
                    del stack[i]
                    break
    return stack


def last_kept(applied: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The most recent remedy still in force (the one a revert undoes), or None."""
    stack = in_force(applied)
    return stack[-1] if stack else None


def apply_refusal(state: SessionState, rec: Mapping[str, Any] | None, *, in_flight: bool = False) -> str | None:
    """Why ``rec`` cannot be applied now (one sentence for the user), or None.

    ``in_flight``: the caller knows of an apply or revert it sent that has not come back yet.
    """
    if rec is None:
        return "No recommendation to apply yet."
    title = rec.get("title") or rec.get("remedy") or rec.get("id")
    if state.finished:
        return "Training has ended: there is no running job to apply a remedy to."
    if not rec.get("live"):
        return f"{title} cannot be applied to a running job: it needs a restart (see its evidence, Enter)."
    if in_flight or state.pending_apply:
        return "An apply is already in flight; wait for its result."
    return None


def inexact_refusal(rec: Mapping[str, Any], *, allowed: bool) -> str | None:
    """A live-opt-in remedy changes numerics: refused unless the user allowed it
    (``--allow-inexact`` headless, or the TUI's confirmation)."""
    if rec.get("apply_class") == "live-opt-in" and not allowed:
        return (f"{rec.get('id')} changes numerics (apply class live-opt-in); "
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


def regime_start(applied: Sequence[Mapping[str, Any]]) -> int | None:
    """The first step run with the job's configuration as it is now; None if it never changed.

    A kept remedy changes it at its ``at_step``; a user revert at the revert's ``at_step``;
    a remedy reverted after its measurement window, at the step after that window. A failed
    apply is undone at the boundary it was tried at and changes nothing.
    """
    changes = [step for step in (_changed_at(a) for a in applied) if step is not None]
    return max(changes) if changes else None


def first_change(applied: Sequence[Mapping[str, Any]]) -> int | None:
    """The first step that ran under any remedy (kept or later reverted); None if none ever did."""
    starts = [int(a["at_step"]) for a in applied
              if a.get("status") in (*IN_FORCE, "reverted") and not _is_user_revert(a) and a.get("at_step") is not None]
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


def _is_user_revert(entry: Mapping[str, Any]) -> bool:
    # An ApplyResult always carries "measured"; the apply_reverted event's data never does.
    return entry.get("status") == "reverted" and "measured" not in entry


def _changed_at(entry: Mapping[str, Any]) -> int | None:
    status = entry.get("status")
    at_step = entry.get("at_step")
    if at_step is None or status not in (*IN_FORCE, "reverted"):
        return None
    if status == "reverted" and not _is_user_revert(entry):
        window = ((entry.get("measured") or {}).get("after") or {}).get("steps") or []
        return max(window) + 1 if window else int(at_step)
    return int(at_step)


def interrupted_applies(state: SessionState) -> list[Event]:
    """An ``apply_result`` event, status "interrupted", for each apply a rank started
    (``apply_started``) and never reported on: the job was killed (SIGKILL, the OOM killer) inside
    the measurement window, so the agent's executor never closed it. Each carries what was
    measured: the rank's steps from ``at_step`` on (peak memory, mean time of its light steps
    after the first), and the "before" the rank sent when it applied."""
    reported = {(e.rank, e.data.get("remedy"), e.data.get("at_step")) for e in state.events if e.name == "apply_result"}
    out = []
    for event in state.events:
        data = event.data
        if event.name != "apply_started" or (event.rank, data.get("remedy"), data.get("at_step")) in reported:
            continue
        at_step = data.get("at_step")
        after = [s for s in state.steps.get(event.rank, []) if at_step is not None and s.index >= at_step]
        timed = [s for s in after[1:] if not s.deep]
        peaks = [s for s in after if s.peak_memory_bytes is not None]
        measured = Measurement(
            peak_memory_bytes=max((s.peak_memory_bytes for s in peaks), default=None),  # type: ignore[type-var]
            step_time_s=sum(s.time_s for s in timed) / len(timed) if timed else None,
            steps=tuple(s.index for s in after), time_steps=tuple(s.index for s in timed),
            peak_steps=tuple(s.index for s in peaks), step_kind="light" if timed else None)
        result = ApplyResult(
            remedy=str(data.get("remedy")), recommendation_id=data.get("recommendation_id"),
            params=data["params"] if isinstance(data.get("params"), dict) else {}, rank=event.rank, at_step=at_step,
            before=_measurement(data.get("before")), after=measured, status="interrupted",
            reason=f"the training process ended without reporting on it (killed) {len(after)} step(s) into "
                   "its measurement window; the figures are the steps it sent")
        out.append(Event(rank=event.rank, step=event.step, name=ApplyResult.EVENT, data=result.to_dict()))
    return out


def _measurement(data: Any) -> Measurement:
    try:
        return Measurement.from_dict(data if isinstance(data, dict) else None)
    except (TypeError, ValueError):  # a wrong-typed "before" from the wire: measured nothing
        return Measurement()
