"""An apply the job's end cut short is "interrupted", with what was measured: not "kept" (it was
never judged) and not missing (it ran). Before, a rank SIGKILLed inside the measurement window
left an ``apply_started`` and nothing else, and the run said the apply "never happened"; the
executor's close (SIGTERM, the script's own end) called it "kept" even over budget
(tests/test_apply_executor.py::test_close_reports_an_unfinished_window covers that side)."""

from __future__ import annotations

from advisor.attach import _applied
from advisor.paths import DB_NAME, new_session_dir
from advisor.records.results import Measurement
from advisor.records.samples import Event, RunInfo, StepSample
from advisor.regime import in_force, regime_start
from advisor.report import build_report
from advisor.controller import AttachOptions, Session
from advisor.store import SessionStore, load_state

BEFORE = Measurement(peak_memory_bytes=900, step_time_s=0.1, steps=(2, 3), time_steps=(2, 3), peak_steps=(2, 3))


def _records() -> list:
    """Steps 0-6 of rank 0, an apply started at step 4 (peak 900 before it, 600-700 after), then
    nothing: the process was SIGKILLed at step 7, two steps into a five-step window."""
    steps = [StepSample(index=i, time_s=0.1, peak_memory_bytes=900 if i < 4 else 600 + 50 * (i - 4), deep=i == 4)
             for i in range(7)]
    started = Event(rank=0, step=3, name="apply_started", data={
        "remedy": "activation_checkpointing", "recommendation_id": "checkpoint-blocks-2",
        "params": {"modules": ["blocks.0"]}, "at_step": 4, "measure_steps": 5, "before": BEFORE.to_dict()})
    return [RunInfo(script="t.py", argv=[]), *steps[:4], started, *steps[4:]]


def _check(applied: list) -> None:
    """``applied`` as the state holds it (typed) or as the report writes it (dicts)."""
    [entry] = [a if isinstance(a, dict) else a.as_history() for a in applied]
    assert entry["status"] == "interrupted" and entry["at_step"] == 4
    assert entry["recommendation_id"] == "checkpoint-blocks-2" and "killed" in entry["reason"]
    after = entry["measured"]["after"]
    assert after["steps"] == [4, 5, 6] and after["peak_memory_bytes"] == 700
    assert after["time_steps"] == [5, 6] and after["step_time_s"] == 0.1  # light steps after the first
    assert entry["measured"]["before"]["peak_memory_bytes"] == 900


def test_a_killed_rank_s_apply_is_interrupted_with_what_was_measured_when_the_session_is_read():
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, finished=True, exit_code=137, exit_reason="killed by SIGKILL")
    for record in _records():
        store.put(record)
    store.close()
    state = load_state(folder / DB_NAME)
    _check(state.applied)
    _check(build_report(state)["applied"])
    assert _applied(state, "auto") and _applied(state, "checkpoint-blocks-2")  # not "never happened"
    # It was in force when the job ended: the job's configuration changed at step 4.
    assert in_force(state.applied) and regime_start(state.applied) == 4


def test_the_controller_records_it_once_when_the_job_ends():
    session = Session(AttachOptions(script="t.py"))
    try:
        for record in _records():
            session._on_record(record)
        session.finish(-9)
        _check(session.live.snapshot().applied)
    finally:
        session.close()
    _check(load_state(session.db_path).applied)  # stored once, not again on reading
