"""No silent step cap: the summary covers every step, and the report says how many it lists."""

import json

import pytest

from advisor.paths import DB_NAME, new_session_dir
from advisor.records.samples import RunInfo, StepSample
from advisor.report import build_report
from advisor.state import MAX_LIVE_STEPS, LiveState
from advisor.store import _SCHEMA, SessionStore, _insert, load_state

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
    import sqlite3

    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, finished=True, exit_code=0, exit_reason="completed")
    for index in range(N):
        store.put(_sample(index))
    store.close()
    with sqlite3.connect(folder / DB_NAME) as conn:  # an old row gets a string time: it must not count
        assert conn.execute("UPDATE step_series SET time_s = 'slow' WHERE idx = 10").rowcount == 1
    report = build_report(load_state(folder / DB_NAME))
    assert report["summary"]["steps"] == N - 1
    assert any("1 malformed record(s) dropped" in w for w in report["warnings"])


def _legacy_store(folder):
    """A session file of the layout before the step tables: every step's JSON in ``records``."""
    import sqlite3

    conn = sqlite3.connect(folder / DB_NAME)
    conn.executescript(_SCHEMA)
    conn.execute("INSERT INTO meta(key, value) VALUES ('session_id', ?), ('finished', 'true'), ('exit_code', '0')",
                 (json.dumps(folder.name),))
    _insert(conn, RunInfo(script="t.py", argv=[]))
    return conn


def test_a_session_of_the_old_layout_still_reads_every_step():
    folder = new_session_dir("t.py")
    conn = _legacy_store(folder)
    for index in range(N):
        sample = _sample(index)
        if index == 10:  # an old row with a string time: dropped, counted, never summed
            conn.execute("INSERT INTO records(received, kind, rank, step, data) VALUES (0, 'step', 0, 10, ?)",
                         (json.dumps({**sample.to_dict(), "time_s": "slow"}),))
            continue
        _insert(conn, sample)
    conn.commit()
    conn.close()
    report = build_report(load_state(folder / DB_NAME))
    assert report["summary"]["steps"] == N - 1 and report["summary"]["steps_listed"] == MAX_LIVE_STEPS
    assert report["steps"][-1]["index"] == N - 1 and report["summary"]["last_loss"] == float(N - 1)
    assert any("1 malformed record(s) dropped" in w for w in report["warnings"])


def test_a_long_runs_step_records_stop_growing_the_file_only_the_series_does(tmp_path):
    """Past the last MAX_LIVE_STEPS, a step costs the file its compact series row (about 80 bytes),
    not its JSON record (about 600): the old records' pages are freed and reused."""
    import os

    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    sizes = []
    for index in range(4 * N):
        store.put(StepSample(index=index, time_s=0.01, loss=1.0, micro_batches=1, losses=[1.0], end_time=1.7e9,
                             phases={k: 0.002 for k in ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s")},
                             optimizer_s={"AdamW": 0.002}))
        if index % 100 == 99:  # at a training job's pace: the writer keeps up, batch by batch
            store.flush()
        if index + 1 in (2 * N, 4 * N):
            store.flush(checkpoint=True)
            sizes.append(os.path.getsize(folder / DB_NAME))
    store.close()
    per_step = (sizes[1] - sizes[0]) / (2 * N)
    assert per_step < 150, per_step
    report = build_report(load_state(folder / DB_NAME))
    assert report["summary"]["steps"] == 4 * N and report["summary"]["steps_listed"] == MAX_LIVE_STEPS


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
