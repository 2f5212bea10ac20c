"""The live advice loop leaves the job's steps alone: it does not re-advise on an apply window's
steps (its CPU slowed the timed steps it measures) until the result, and it computes at a lower
priority than the job."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from recommendations import recommendation

from advisor import advice as advice_module
from advisor.advice import WINDOW_STEPS, AdviceLoop
from advisor.priority import BACKGROUND_NICENESS
from advisor.records.results import ApplyResult
from advisor.records.samples import StepSample
from advisor.records.settings import AgentSettings
from advisor.state import LiveState


def _loop(monkeypatch) -> tuple[AdviceLoop, list[int], list]:
    refreshed: list[int] = []
    monkeypatch.setattr(advice_module, "advise_state", lambda state, budget_bytes=None: (refreshed.append(1), (None, state.recommendations))[1])
    live = LiveState()
    live.update(recommendations=[recommendation("r", "t", apply_class="live-exact")])
    sent: list = []
    session = SimpleNamespace(live=live, options=SimpleNamespace(settings=AgentSettings()),
                              send_command=lambda c: sent.append(c) or 1, id="s")
    return AdviceLoop(session, budget_bytes=None), refreshed, sent


def _deep(index: int) -> StepSample:
    return StepSample(index=index, time_s=0.01, deep=True)


def test_the_windows_steps_are_advised_on_when_its_result_comes(monkeypatch) -> None:
    loop, refreshed, sent = _loop(monkeypatch)
    try:
        loop.on_record(_deep(1))
        assert loop.wait_idle(30) and len(refreshed) == 1  # an ordinary deep step: advised on
        assert loop.apply("r") is None
        [command] = sent
        for index in range(command.at_step, command.at_step + 3):  # the window's deep steps
            loop.on_record(_deep(index))
        assert loop.wait_idle(30) and len(refreshed) == 1
        result = ApplyResult(remedy="t", recommendation_id="r", at_step=command.at_step, status="kept")
        loop.on_record(result.event(rank=0, step=command.at_step + 3))
        assert loop.wait_idle(30) and len(refreshed) == 2  # the result: advice on the whole window
        loop.on_record(_deep(command.at_step + 10))
        assert loop.wait_idle(30) and len(refreshed) == 3  # after it, deep steps again
    finally:
        loop.close()


def test_a_result_that_never_comes_stops_the_wait(monkeypatch) -> None:
    loop, refreshed, sent = _loop(monkeypatch)
    try:
        assert loop.apply("r") is None
        loop.on_record(_deep(sent[0].at_step + 1))
        assert loop.wait_idle(30) and refreshed == []
        loop.on_record(_deep(sent[0].at_step + WINDOW_STEPS + 1))
        assert loop.wait_idle(30) and len(refreshed) == 1
    finally:
        loop.close()


def test_a_failed_refresh_is_said_and_tried_again_on_a_light_step(monkeypatch) -> None:
    """Advice is made after deep steps; one that raised (a recommender bug on this job's records)
    is said once in the warnings and tried again on a later step, light ones too: before, the job
    went its whole run with no advice and no word why (a live DDP job in CI, 29,000 steps)."""
    outcomes = [RuntimeError("boom at step 1"), RuntimeError("boom at step 2"), None]
    recs = [recommendation("r", "t", apply_class="live-exact")]

    def advise(state, budget_bytes=None):
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return None, recs

    monkeypatch.setattr(advice_module, "advise_state", advise)
    monkeypatch.setattr(advice_module, "RETRY_S", 0.0)
    live, warned = LiveState(), []
    session = SimpleNamespace(live=live, options=SimpleNamespace(settings=AgentSettings()), id="s",
                              warn=lambda message, source=None: warned.append((source, message)))
    loop = AdviceLoop(session, budget_bytes=None)
    try:
        loop.on_record(_deep(1))
        assert loop.wait_idle(30) and loop.last_error == "RuntimeError: boom at step 1"
        assert live.snapshot().recommendations == []
        loop.on_record(StepSample(index=2, time_s=0.01))  # a light step: the failed refresh again
        assert loop.wait_idle(30) and len(outcomes) == 1
        assert [source for source, _ in warned] == ["advice"] and "RuntimeError: boom at step 1" in warned[0][1]
        loop.on_record(StepSample(index=3, time_s=0.01))
        assert loop.wait_idle(30) and outcomes == [] and loop.last_error is None
        assert [r.id for r in live.snapshot().recommendations] == ["r"]
        loop.on_record(StepSample(index=4, time_s=0.01))  # advice in hand: light steps are not advised on
        assert loop.wait_idle(30) and loop.last_error is None  # (a call would pop an empty list)
    finally:
        loop.close()


def test_light_steps_refresh_the_advice_at_a_doubling_interval(monkeypatch) -> None:
    """No deep step yet (none scheduled, sampling stopped, a slow first step), or deep steps long
    past: light steps refresh the advice, at most every LIGHT_S, a wait that doubles after each
    refresh up to LIGHT_MAX_S. A 2-rank job kept a straggler diagnosis made from its first four
    steps (the deep ones among them) for 25,000 steps, with no recommendation."""
    monkeypatch.setattr(advice_module, "LIGHT_S", 0.0)
    loop, refreshed, _ = _loop(monkeypatch)
    try:
        loop.on_record(StepSample(index=0, time_s=0.01))
        assert loop.wait_idle(30) and len(refreshed) == 1
        loop.on_record(StepSample(index=1, time_s=0.01))
        assert loop.wait_idle(30) and len(refreshed) == 2
        loop.on_record(_deep(2))
        assert loop.wait_idle(30) and len(refreshed) == 3
        loop.on_record(StepSample(index=3, time_s=0.01))  # after a deep step too
        assert loop.wait_idle(30) and len(refreshed) == 4
    finally:
        loop.close()
    monkeypatch.setattr(advice_module, "LIGHT_S", 3600.0)
    loop, refreshed, _ = _loop(monkeypatch)
    try:
        loop.on_record(StepSample(index=0, time_s=0.01))  # not yet due
        assert loop.wait_idle(30) and refreshed == []
        loop.on_record(_deep(1))  # a deep step: advised on at once, and the next light one not before the wait
        assert loop.wait_idle(30) and len(refreshed) == 1
        assert loop._retry_at > advice_module.time.monotonic() + 3000
        assert loop._light_wait == advice_module.LIGHT_MAX_S  # doubled, then capped
        loop.on_record(StepSample(index=2, time_s=0.01))
        assert loop.wait_idle(30) and len(refreshed) == 1
    finally:
        loop.close()


def _nice(tid: int) -> int:
    # /proc/self/task/TID/stat: the 19th field is the nice value (after the parenthesised name)
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[16])


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priority is Linux's")
def test_the_advice_runs_below_the_jobs_priority(monkeypatch) -> None:
    """The advice thread computes in bursts while the job trains on the same cores: it runs at a
    lower priority, and the controller's other threads (the receiver, the main one) do not."""
    loop, _, _ = _loop(monkeypatch)
    try:
        main = _nice(threading.get_native_id())
        loop.on_record(_deep(1))
        assert loop.wait_idle(30)  # the loop thread ran: its first act lowered its priority
        assert _nice(loop._thread.native_id) == min(19, main + BACKGROUND_NICENESS)
        assert _nice(threading.get_native_id()) == main
    finally:
        loop.close()


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priority is Linux's")
def test_the_store_writes_below_the_jobs_priority(tmp_path) -> None:
    from advisor.records.samples import RunInfo
    from advisor.store import SessionStore

    store = SessionStore(tmp_path / "session.sqlite")
    try:
        store.put(RunInfo(script="x.py", argv=[]))
        main, tid = _nice(threading.get_native_id()), store._thread.native_id
        # the writer lowers its priority first thing; no event marks it, so poll to a deadline
        waited = threading.Event()
        for _ in range(3000):
            if _nice(tid) != main:
                break
            waited.wait(0.01)
        assert _nice(tid) == min(19, main + BACKGROUND_NICENESS)
    finally:
        store.close()
