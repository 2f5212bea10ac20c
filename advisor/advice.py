"""The controller's advice loop: re-advise as measurements arrive, send apply commands.

``recommend/`` is pure: it reads the report's sections. This module decides
*when* to ask it (after each deep-sampled step, after an OOM, at the end), and
turns a chosen recommendation into a command for every rank's executor.
"""

from __future__ import annotations

import copy
import sys
import threading
import time
from typing import Any

from advisor.state import SessionState
from advisor.records.remedy import command_digest
from advisor.records.samples import Event, Record, StepSample

MEASURE_STEPS = 3  # steps measured after an apply before keep-or-revert


def advise_report(report: dict[str, Any], *, budget_bytes: int | None = None) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Diagnosis and ranked recommendations (as report dicts) for a report's measurements."""
    from advisor.recommend.advise import advise
    from advisor.recommend.profile import profile_from_report

    memory = report.get("memory") or {}
    if not report.get("steps") and not memory.get("modules") and not memory.get("oom"):
        return None, []  # nothing measured yet (an OOM before the first step still counts)
    profile = profile_from_report(report, budget_bytes=budget_bytes)
    diagnosis, recommendations = advise(profile)
    return diagnosis.to_dict(), [r.to_dict() for r in recommendations]


def current_regime(state: SessionState) -> SessionState:
    """The part of a session measured since the last kept remedy (the job as it runs now).

    Advice must describe the job as it is: after a kept checkpointing plan the
    old peak no longer exists. Falls back to the whole session when nothing was
    measured yet under the remedy.
    """
    kept = [a for a in state.applied if a.get("status") == "kept" and a.get("at_step") is not None]
    if not kept:
        return state
    since = max(a["at_step"] for a in kept)
    regime = copy.copy(state)
    regime.steps = {r: [s for s in samples if s.index >= since] for r, samples in state.steps.items()}
    regime.memory = [m for m in state.memory if m.step >= since]
    regime.modules = [m for m in state.modules if m.step >= since]
    if not regime.modules or not any(s.deep for samples in regime.steps.values() for s in samples):
        return state
    return regime


def _partial_report(state: SessionState, budget_bytes: int | None) -> dict[str, Any]:
    from advisor.report import run_section, steps_section
    from advisor.sections.memory import build_memory_section

    return {"run": run_section(state), "steps": steps_section(state),
            "memory": build_memory_section(state, budget_bytes=budget_bytes)}


class AdviceLoop:
    def __init__(self, session: Any, *, budget_bytes: int | None, apply: str | None = None,
                 apply_at_step: int | None = None) -> None:
        self.session = session
        self.budget_bytes = budget_bytes
        self.apply_request = apply
        self.apply_at_step = apply_at_step
        self._dirty = threading.Event()
        self._closed = False
        self._applied_auto = False
        self._lock = threading.Lock()
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._loop, name="advisor-advice", daemon=True)
        self._thread.start()

    # -- called on the receiver thread: cheap --------------------------------------------
    def on_record(self, record: Record) -> None:
        if (isinstance(record, StepSample) and record.deep) or (
                isinstance(record, Event) and record.name in ("oom", "apply_result")):
            self._dirty.set()

    # -- background ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed:
            if self._dirty.wait(0.5) and not self._closed:
                self._dirty.clear()
                self.refresh()
            self._maybe_auto_apply()

    def refresh(self) -> None:
        """Re-run the recommender on everything measured so far."""
        with self._lock:
            state = self.session.live.snapshot()
            try:
                regime = current_regime(state)
                diagnosis, recs = advise_report(_partial_report(regime, self.budget_bytes),
                                                budget_bytes=self.budget_bytes)
            except Exception as exc:  # noqa: BLE001 - advice must never stop the recording
                self.last_error = f"{type(exc).__name__}: {exc}"
                return
            self.session.live.update(diagnosis=diagnosis, recommendations=recs)

    def _maybe_auto_apply(self) -> None:
        if not self.apply_request or self._applied_auto:
            return
        state = self.session.live.snapshot()
        if state.finished or not state.recommendations:
            return
        rec = self._choose(state.recommendations, self.apply_request)
        if rec is None:
            if self.apply_request != "auto":
                self._applied_auto = True
                print(f"advisor: no live recommendation {self.apply_request!r}; valid: "
                      f"{', '.join(r['id'] for r in state.recommendations) or 'none'}", file=sys.stderr)
            return
        self._applied_auto = True
        error = self.apply(rec["id"], at_step=self.apply_at_step)
        if error:
            print(f"advisor: not applied: {error}", file=sys.stderr)

    @staticmethod
    def _choose(recs: list[dict[str, Any]], request: str) -> dict[str, Any] | None:
        live = [r for r in recs if r.get("live")]
        if request == "auto":
            return live[0] if live else None
        return next((r for r in live if r["id"] == request), None)

    # -- user actions (TUI, headless --apply) -------------------------------------------
    def apply(self, recommendation_id: str, *, at_step: int | None = None, confirmed: bool = False) -> str | None:
        """Send one apply command to every rank; the reason it was not sent, or None.

        ``confirmed``: the user accepted a live-opt-in remedy's numerics change (the TUI's dialog);
        without it such a remedy needs ``--allow-inexact`` (``allow_inexact`` in the agent config).
        """
        state = self.session.live.snapshot()
        rec = next((r for r in state.recommendations if r["id"] == recommendation_id), None)
        if rec is None:
            return f"no recommendation {recommendation_id!r}"
        if not rec.get("live"):
            return f"{recommendation_id} cannot be applied to a running job"
        if state.finished:
            return "the training job has ended"
        if state.pending_apply:
            return "an apply is already in progress"
        allow_inexact = bool(getattr(self.session, "options", None)
                             and self.session.options.agent_config.get("allow_inexact"))
        if rec.get("apply_class") == "live-opt-in" and not (confirmed or allow_inexact):
            return (f"{recommendation_id} changes numerics (apply class live-opt-in); "
                    "pass --allow-inexact to `advisor attach`, or confirm it in the TUI")
        # All ranks apply at the same boundary: one past the furthest rank, or the step asked for.
        target = max(at_step or 0, state.latest_step() + 2)
        sent = self.session.send_command({"type": "apply", "recommendation": rec, "at_step": target,
                                          "measure_steps": MEASURE_STEPS, "confirmed": confirmed,
                                          "digest": command_digest(rec["remedy"], rec.get("params") or {}, target)})
        if not sent:
            return "no training process is connected"
        self.session.live.update(pending_apply={"recommendation_id": recommendation_id,
                                                "requested_at": time.time(), "at_step": target})
        return None

    def revert(self) -> str | None:
        state = self.session.live.snapshot()
        if state.finished:
            return "the training job has ended"
        if not any(a.get("status") == "kept" for a in state.applied):
            return "nothing applied to revert"
        return None if self.session.send_command({"type": "revert"}) else "no training process is connected"

    def finish(self) -> None:
        self.refresh()

    def close(self) -> None:
        self._closed = True
        self._dirty.set()
        self._thread.join(2)
