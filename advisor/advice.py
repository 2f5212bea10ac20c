"""The controller's advice: one path from a session's records to its advice, and the live loop.

``advise_state`` is the only way the advisor asks ``recommend/`` for advice:
the live ``AdviceLoop``, ``advisor report`` (advisor/sections) and ``advisor
plan`` all call it on a ``SessionState``, so they see the same records and
give the same answer; the report only serialises it. The loop decides *when*
to ask (after each deep-sampled step, after an OOM or an apply result, at the
end; not while an apply's window measures the job) and turns a chosen
recommendation into a command for every rank.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from typing import Any

from advisor.priority import lower_priority
from advisor.recommend.advise import advise
from advisor.recommend.calibration import model_errors
from advisor.recommend.profile import Profile, has_measurements, profile_from_records
from advisor.records.advice import Diagnosis, Recommendation, StepSpan
from advisor.records.commands import RELEASE, ApplyCommand, RevertCommand
from advisor.records.events import SAID_BY_ADVICE, Oom
from advisor.records.remedy import command_digest
from advisor.records.results import ApplyResult, RevertResult
from advisor.records.samples import Event, Record, StepSample
from advisor.records.schedule import DEEP_STEPS, first_timed_light_step
from advisor.regime import apply_refusal, current_regime, inexact_refusal, revert_refusal
from advisor.state import PendingApply, SessionState

MEASURE_STEPS = 3  # steps measured after an apply before keep-or-revert
# Steps past an apply's step after which its window is taken as over even with no result: far more
# than a window takes (its deep steps, then MEASURE_STEPS settled light ones; apply/executor.py).
WINDOW_STEPS = 32
# Advice is made after deep steps, and on light steps too, at most every LIGHT_S, that wait
# doubling after each refresh up to LIGHT_MAX_S: a job with no deep step (none scheduled, sampling
# stopped) gets advice before it ends, and a diagnosis made from the first steps is made again on
# the steady ones (a 2-rank job kept "rank 0 is a straggler, no remedy" from steps 0-3, its deep
# ones, for 25,000 steps). A refresh that failed is tried again on a later step, at most every
# RETRY_S (one failure left a job with no advice for its whole run).
RETRY_S = 2.0
LIGHT_S = 10.0
LIGHT_MAX_S = 300.0



def recorded_budget(state: SessionState) -> int | None:
    """The --memory-budget the session was recorded with, if any."""
    for run in state.runs.values():
        if run.config.get("memory_budget_bytes"):
            return int(run.config["memory_budget_bytes"])
    return None


def session_budget(state: SessionState, budget_bytes: int | None = None) -> int | None:
    """The budget a report or a plan of ``state`` is judged against: ``budget_bytes``, else the
    --memory-budget the session was recorded with, else the first run's device memory (the
    documented default, README and docs/report-schema.md)."""
    budget = budget_bytes or recorded_budget(state)
    if budget:
        return budget
    run = state.runs.get(0) or (state.runs[min(state.runs)] if state.runs else None)
    capacity = run.device.get("memory_capacity") if run is not None else None
    return int(capacity) if capacity else None


def advise_state(state: SessionState, *, budget_bytes: int | None = None
                 ) -> tuple[Diagnosis | None, list[Recommendation]]:
    """Diagnosis and ranked recommendations for the job as it runs now.

    Reads the current regime's records (advisor/regime.py), and every apply of the session to
    calibrate step-time predictions (``recommend/calibration.py``); ``budget_bytes`` overrides the
    budget the session was recorded with. ``(None, [])`` when nothing is measured yet.
    """
    regime = current_regime(state)
    profile = _profile_of_regime(regime, state, budget_bytes)
    if profile is None:
        return None, []
    # Calibration reads the whole session's applies, not only the current regime's.
    diagnosis, recommendations = advise(profile, errors=model_errors(state.applied, state.steps))
    described = regime.rank0_steps()
    if described:
        diagnosis = replace(diagnosis, steps=StepSpan(first=described[0].index, last=described[-1].index))
    return diagnosis, recommendations


def profile_of_state(state: SessionState, *, budget_bytes: int | None = None) -> Profile | None:
    """The ``Profile`` of the current regime's records (None when nothing is measured yet)."""
    return _profile_of_regime(current_regime(state), state, budget_bytes)


def _profile_of_regime(regime: Any, state: SessionState, budget_bytes: int | None) -> Profile | None:
    steps = [s for rank in sorted(regime.steps) for s in regime.steps[rank]]
    if not has_measurements(steps=steps, modules=regime.modules, events=regime.events):
        return None
    return profile_from_records(
        steps=steps, memory=regime.memory, modules=regime.modules, ops=regime.ops,
        collectives=regime.collectives, events=regime.events,
        runs=[regime.runs[r] for r in sorted(regime.runs)], models=regime.models,
        optimizers=regime.optimizers, budget_bytes=budget_bytes or recorded_budget(state))


class AdviceLoop:
    """Re-advises in the background as records arrive; applies and reverts on request."""

    def __init__(self, session: Any, *, budget_bytes: int | None, apply: str | None = None,
                 apply_at_step: int | None = None) -> None:
        self.session = session
        self.budget_bytes = budget_bytes
        self.apply_request = apply
        self.apply_at_step = apply_at_step
        self._idle = threading.Condition()
        self._dirty = False  # guarded by _idle
        self._refreshing = False  # guarded by _idle
        self._closed = False
        self._applied_auto = False
        self._released = False  # the ranks held for the decision at apply_at_step were let go
        self._said_unfit = False  # `auto` found only recommendations over the budget, and said so
        self._advised_step = -1  # the latest step the recommendations in hand were made with
        self._window: int | None = None  # the step of an apply sent and not answered yet (guarded by _idle)
        self._lock = threading.Lock()  # one refresh at a time (loop thread, finish())
        self.last_error: str | None = None  # the last refresh's failure, None once one succeeds
        # When a light step may refresh (guarded by _idle; None while a refresh it asked for runs).
        self._retry_at: float | None = time.monotonic() + LIGHT_S
        self._light_wait = LIGHT_S  # the next wait between light-step refreshes
        self._said_errors: set[str] = set()  # exception types said in a warning
        self._thread = threading.Thread(target=self._loop, name="advisor-advice", daemon=True)
        self._thread.start()

    # -- called on the receiver thread: cheap --------------------------------------------
    def on_record(self, record: Record) -> None:
        # Light steps too while an apply waits: a rule may need them, and the first light step
        # after the deep ones times the blocks the predictions read (``_ready``).
        waiting = self.apply_request is not None and not self._applied_auto
        answered = isinstance(record, Event) and record.name in (ApplyResult.NAME, RevertResult.NAME)
        stepped = isinstance(record, StepSample) and (record.deep or waiting or self._retry_due())
        if not (stepped or answered or isinstance(record, Event) and record.name == Oom.NAME):
            return
        with self._idle:
            if answered:
                self._window = None
            elif stepped and self._measuring(record.index):
                return
            if stepped and not (record.deep or waiting):
                self._retry_at = None  # this light step is the retry: the refresh sets the next one
            self._dirty = True
            self._idle.notify_all()

    def _retry_due(self) -> bool:
        retry_at = self._retry_at
        return retry_at is not None and time.monotonic() >= retry_at

    def _measuring(self, step: int) -> bool:
        """Whether an apply's window is measuring the job at ``step`` (called holding ``_idle``):
        its steps are not advised on until the result comes (which advises on them all). Advice
        from the window's deep steps, computed while the job ran its timed light steps, slowed
        those 20-40% on two cores (the zoo's hf_clm read +23% over its prediction); the advice
        would be about a regime in flight anyway. A result that never comes (a lost rank) stops
        the wait ``WINDOW_STEPS`` steps on."""
        if self._window is None:
            return False
        if step > self._window + WINDOW_STEPS:
            self._window = None
            return False
        return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every record seen so far has been advised on; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._closed or not (self._dirty or self._refreshing), timeout)

    # -- background ------------------------------------------------------------------------
    def _loop(self) -> None:
        lower_priority()  # its bursts of CPU after each deep step must not slow the job's steps
        while not self._closed:
            with self._idle:
                self._idle.wait_for(lambda: self._dirty or self._closed, 0.5)
                run = self._dirty and not self._closed
                if run:
                    self._dirty, self._refreshing = False, True
            if run:
                try:
                    self.refresh()
                finally:
                    with self._idle:
                        self._refreshing = False
                        self._idle.notify_all()
            self._maybe_auto_apply()

    def refresh(self) -> None:
        """Re-run the recommender on everything measured so far (``advise_state``)."""
        with self._lock:
            state = self.session.live.snapshot()
            try:
                diagnosis, recs = advise_state(state, budget_bytes=self.budget_bytes)
            except Exception as exc:  # noqa: BLE001 - advice must never stop the recording
                self._failed(exc)
                return
            self.last_error = None
            with self._idle:
                self._retry_at = time.monotonic() + self._light_wait
                self._light_wait = min(2 * self._light_wait, LIGHT_MAX_S)
            self.session.live.update(diagnosis=diagnosis, recommendations=recs)
            # The step every rank had sent: the baseline is the lowest rank's steps, and on two ranks
            # advice "made with step 4" held rank 1's step 4 but not rank 0's (no baseline yet).
            self._advised_step = state.step_all_ranks_reached()

    def _failed(self, exc: Exception) -> None:
        """A refresh raised: the recommendations in hand stay, a later step tries again, and the
        user reads why once per exception type (in the TUI's warnings and the report), not silence
        (a message naming a step would otherwise repeat every RETRY_S)."""
        kind = type(exc).__name__
        error = self.last_error = f"{kind}: {exc}"
        with self._idle:
            self._retry_at = time.monotonic() + RETRY_S
        if kind in self._said_errors:
            return
        self._said_errors.add(kind)
        warn = getattr(self.session, "warn", None)
        if callable(warn):
            warn(f"the recommender failed on the records so far ({error}); it runs again on a later step",
                 source="advice")

    def _maybe_auto_apply(self) -> None:
        if not self.apply_request or self._applied_auto:
            return
        state = self.session.live.snapshot()
        if state.finished or not state.recommendations or not self._ready(state):
            self._release_if_held()
            return
        rec = self._choose(state.recommendations, self.apply_request, allow_inexact=self._allow_inexact())
        if rec is None:
            self._release_if_held()
            # A named recommendation may come with later advice (a rule needs light steps to
            # fire): wait for it until the step the apply was asked for (else a few steps).
            due = (self.apply_at_step if self.apply_at_step is not None else 3)
            if self.apply_request != "auto" and state.latest_step() >= due:
                self._applied_auto = True
                print(f"advisor: no live recommendation {self.apply_request!r}; valid: "
                      f"{', '.join(r.id for r in state.recommendations) or 'none'}", file=sys.stderr)
            elif self.apply_request == "auto" and state.latest_step() >= due and not self._said_unfit:
                self._said_unfit = True  # said once; a later advice may still bring one that fits
                self._say(auto_nothing_reason(state.recommendations, allow_inexact=self._allow_inexact()))
            return
        self._applied_auto = True
        error = self.apply(rec.id, at_step=self.apply_at_step if self.apply_at_step is not None else self._auto_step())
        if error:
            self._say(f"not applied: {error}")
            self._release_if_held(force=True)

    def _allow_inexact(self) -> bool:
        options = getattr(self.session, "options", None)
        return bool(options is not None and options.settings.allow_inexact)

    def _say(self, message: str) -> None:
        """A decision about --apply the user reads: on stderr now, and in the report's warnings
        (source ``SAID_BY_ADVICE``: the headless progress lines do not print it a second time)."""
        print(f"advisor: {message}", file=sys.stderr, flush=True)
        warn = getattr(self.session, "warn", None)
        if callable(warn):
            warn(message, source=SAID_BY_ADVICE)

    def _release_if_held(self, *, force: bool = False) -> None:
        """With ``--apply-at-step K`` the ranks wait at the boundary before K (after sending
        step K-2) for this loop's decision: once advice made with that step says nothing is
        applied there, let them go on (a later apply still goes to the next boundary it can).
        ``force``: the one choice there was got refused, so no later advice will send one: let
        them go at once (a refused choice held two ranks 60 s for a decision that never came)."""
        if self.apply_at_step is None or self._released:
            return
        if not force and self._advised_step < self.apply_at_step - 2:
            return
        self._released = True
        self.session.send_command({"type": RELEASE})

    def _ready(self, state: Any) -> bool:
        """Whether to choose the remedy now. Before the first block-timed light step after the
        deep ones (step 5 by default) the baseline step time is step 0's (warm-up) and the
        recompute cost the deep steps' scaled module times; that step measures both. So when the
        step asked for (``--apply-at-step K``; none: as soon as ready) comes after it, wait for
        advice made with it, or for the last boundary that still meets the step asked for. With
        a K after it, wait for advice made with step K-2, the last the job sends before it holds
        for the decision: every light step up to there is in the baseline and the block times
        (advice made with one light step alone made a slow one the baseline, +8 ms on a 50 ms GPT
        step). An earlier step asked for is chosen from the first advice (for ``auto``, the first
        made with a deep step, even when that comes too late for the step asked for)."""
        deep = self._deep_steps()
        if self.apply_request == "auto" and deep and self._advised_step < min(deep):
            # Advice made before the first deep step has no memory timeline or op figures: under
            # load `auto` took a fused optimizer, or an optimizer-state offload sized on step 0's
            # peak, for a job over its memory budget. No step asked for is worth that. A named
            # remedy is the user's choice, not the measurement's: it keeps the step asked for.
            return False
        expected = first_timed_light_step(deep)
        if expected is None:
            return True
        if self.apply_at_step is not None and self.apply_at_step < expected + 2:
            return True  # the light step cannot inform that boundary: do not wait for it
        wanted = expected if self.apply_at_step is None else max(expected, self.apply_at_step - 2)
        if self._advised_step >= wanted:
            return True  # the advice in hand was made with that step (not a refresh before it)
        if self.apply_request == "auto" and self.apply_at_step is None and self._advised_step < expected:
            # Advice made before any ordinary step has only the warm-up step 0 (or deep steps) for
            # its step-time baseline, several times slower than an ordinary step: `auto` with no
            # step asked for chooses by predicted step time, so it waits for that step's advice and
            # applies at the next boundary it can (predictions on such a base read +14% to +157% off).
            return False
        due = self.apply_at_step if self.apply_at_step is not None else expected + 2
        return state.latest_step() + 2 >= due

    def _auto_step(self) -> int | None:
        """With no step asked for, the earliest boundary whose before window holds ``MEASURE_STEPS``
        ordinary light steps after the first block-timed one (step 9 by default: 6, 7 and 8). An
        apply at the next boundary after that step's advice (7) had step 6 alone to compare with:
        minGPT's adder read 22 ms there, beside 12-14 ms on the steps around it, and the remedy's
        measured change came out 45% off its prediction."""
        expected = first_timed_light_step(self._deep_steps())
        return None if expected is None else expected + 1 + MEASURE_STEPS

    def _deep_steps(self) -> list[int]:
        settings = getattr(getattr(self.session, "options", None), "settings", None)
        return list(DEEP_STEPS if settings is None else settings.deep_steps)

    @staticmethod
    def _choose(recs: list[Recommendation], request: str, *, allow_inexact: bool = False) -> Recommendation | None:
        """``auto``: the best live recommendation that fits the memory budget (the ranking puts
        those first) and that it may apply; one that does not fit would only be reverted by the
        executor, over the budget, after its measuring window (an optimizer-state offload at 50%
        of a GPT's peak was). A remedy that predicts no peak does not fit a budget
        (``fits_budget``): gradient compression once "fitted" an over-budget job because it said
        nothing of memory. A live-opt-in remedy without ``--allow-inexact`` is never chosen: on
        two ranks it was, was refused, and held the job at the boundary."""
        live = [r for r in recs if r.live and r.applicable]
        if request != "auto":
            return next((r for r in live if r.id == request), None)
        return next((r for r in live if r.fits and inexact_refusal(r, allowed=allow_inexact) is None), None)

    # -- user actions (TUI, headless --apply) -------------------------------------------
    def apply(self, recommendation_id: str, *, at_step: int | None = None, confirmed: bool = False) -> str | None:
        """Send one apply command to every rank; the reason it was not sent, or None.

        ``confirmed``: the user accepted a live-opt-in remedy's numerics change (the TUI's dialog);
        without it such a remedy needs ``--allow-inexact`` (``allow_inexact`` in the agent config).
        """
        refusal = self._not_decider()
        if refusal:
            return refusal
        state = self.session.live.snapshot()
        rec = next((r for r in state.recommendations if r.id == recommendation_id), None)
        if rec is None:
            return f"No recommendation {recommendation_id!r}."
        refusal = apply_refusal(state, rec) or inexact_refusal(rec, allowed=confirmed or self._allow_inexact())
        if refusal:
            return refusal
        # All ranks apply at the same boundary: one past the furthest rank, or the step asked for.
        target = max(at_step or 0, state.latest_step() + 2)
        command = ApplyCommand(recommendation=rec, at_step=target, measure_steps=MEASURE_STEPS, confirmed=confirmed,
                               digest=command_digest(rec.remedy, rec.params, target))
        if not self.session.send_command(command):
            return "no training process is connected"
        with self._idle:
            self._window = target
        self.session.live.update(pending_apply=PendingApply(recommendation_id=recommendation_id,
                                                            requested_at=time.time(), at_step=target))
        return None

    def revert(self) -> str | None:
        """Send a revert of the remedy in force; returns why it was not sent, or None."""
        refusal = self._not_decider() or revert_refusal(self.session.live.snapshot())
        if refusal:
            return refusal
        # Every rank reverts at the same boundary, after voting on it: one past the furthest rank.
        command = RevertCommand(at_step=self.session.live.snapshot().latest_step() + 2)
        return None if self.session.send_command(command) else "no training process is connected"

    def _not_decider(self) -> str | None:
        """In a multi-node job only the controller that hosts global rank 0 decides (advisor/multinode.py):
        the others show its decisions and results, and refuse to issue conflicting commands."""
        decides = getattr(self.session, "decides", None)
        verdict = decides() if callable(decides) else True
        if verdict:
            return None
        job = getattr(self.session, "job", None) or {}
        if verdict is None:
            return "this node's ranks have not connected yet: it is not known whether this controller decides"
        return (f"not the deciding controller: job {job.get('id')} is decided by the controller on the node that "
                f"hosts global rank 0 (this one hosts rank(s) {job.get('ranks_hosted')}); apply or revert there")

    def finish(self) -> None:
        self.refresh()

    def close(self) -> None:
        with self._idle:
            self._closed = True
            self._idle.notify_all()
        self._thread.join(2)


def auto_nothing_reason(recs: list[Recommendation], *, allow_inexact: bool) -> str:
    """Why ``--apply auto`` applied nothing, in one line."""
    live = [r for r in recs if r.live and r.applicable]
    refused = [r for r in recs if not r.applicable]
    cannot = f"; {', '.join(r.id for r in refused)} cannot apply to this job ({refused[0].why})" if refused else ""
    if not live:
        restart = [r.id for r in recs if r.applicable]
        return "--apply auto applied nothing: no live recommendation" + (
            f" (restart remedies, applied with --plan: {', '.join(restart)})" if restart else "") + cannot
    unfit = [r.id for r in live if not r.fits]
    opt_in = [r.id for r in live if r.fits and inexact_refusal(r, allowed=allow_inexact) is not None]
    parts = []
    if unfit:
        parts.append(f"{', '.join(unfit)} would not fit the memory budget")
    if opt_in:
        parts.append(f"{', '.join(opt_in)} would change numerics (--allow-inexact to let auto choose them)")
    return "--apply auto applied nothing: " + "; ".join(parts) + cannot
