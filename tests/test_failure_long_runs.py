"""No silent step cap: the summary covers every step, and the report says how many it lists."""

import pytest

from advisor.paths import DB_NAME, new_session_dir
from advisor.records.samples import RunInfo, StepSample
from advisor.report import build_report
from advisor.state import MAX_LIVE_STEPS, LiveState
from advisor.store import SessionStore, load_state

N = MAX_LIVE_STEPS + 2000


def _sample(index: int) -> StepSample:
    # The first 3000 steps are slow: a median over only the last MAX_LIVE_STEPS would miss them.
    time_s = 1.0 if index < 3000 else 0.1
    return StepSample(index=index, time_s=time_s, loss=float(index), phases={"forward_s": time_s})


def _check(report):
    summary = report["summary"]
    assert summary["steps"] == N and summary["steps_total"] == N
    assert summary["steps_listed"] == len(report["steps"]) == MAX_LIVE_STEPS
    assert summary["steps_dropped"] == N - MAX_LIVE_STEPS
    assert summary["mean_step_s"] == pytest.approx((2999 * 1.0 + (N - 3000) * 0.1) / (N - 1))  # all but warm-up
    assert summary["phase_share"]["forward_s"] == pytest.approx(1.0)
    assert summary["last_loss"] == float(N - 1)
    assert report["steps"][-1]["index"] == N - 1


def test_live_summary_covers_steps_beyond_the_live_window():
    live = LiveState()
    live.add(RunInfo(script="t.py", argv=[]))
    for index in range(N):
        live.add(_sample(index))
    _check(build_report(live.snapshot()))


def test_stored_session_summary_covers_every_step():
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, finished=True, exit_code=0, exit_reason="completed")
    store.put(RunInfo(script="t.py", argv=[]))
    for index in range(N):
        store.put(_sample(index))
    store.close()
    _check(build_report(load_state(folder / DB_NAME)))


def test_a_malformed_old_step_is_dropped_and_counted_not_summed():
    import json
    import sqlite3

    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, finished=True, exit_code=0, exit_reason="completed")
    for index in range(N):
        store.put(_sample(index))
    store.close()
    with sqlite3.connect(folder / DB_NAME) as conn:  # an old row gets a string time: it must not count
        conn.execute("UPDATE records SET data = ? WHERE kind = 'step' AND step = 10",
                     (json.dumps({**_sample(10).to_dict(), "time_s": "slow"}),))
    report = build_report(load_state(folder / DB_NAME))
    assert report["summary"]["steps"] == N - 1
    assert any("1 malformed record(s) dropped" in w for w in report["warnings"])


def test_other_record_lists_are_capped_and_say_so(monkeypatch):
    import advisor.state as state_module
    from advisor.records.samples import Event

    monkeypatch.setattr(state_module, "MAX_LIVE_RECORDS", 100)
    live = LiveState()
    for index in range(250):
        live.add(Event(name="note", step=index, data={}))
    state = live.snapshot()
    assert len(state.events) <= 100 and state.events[-1].step == 249
    assert state.records_dropped == {"event": 250 - len(state.events)}
    assert build_report(state)["summary"]["records_dropped"] == {"event": 250 - len(state.events)}
