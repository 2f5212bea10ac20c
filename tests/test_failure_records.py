"""One malformed record is dropped, counted and warned about; the rest of the session still reports."""

import json
import sqlite3
import time

import pytest

from advisor.intake import RecordError, parse_record
from advisor.paths import DB_NAME, new_session_dir
from advisor.records.samples import ExitInfo, StepSample
from advisor.records.wire import new_secret
from advisor.report import build_report
from advisor.server import ChannelServer
from advisor.store import SessionStore, load_state


@pytest.mark.parametrize("kind, data", [
    ("exit", {"rank": 0, "code": 1, "reason": ["a"]}),
    ("step", {"index": "3", "time_s": 0.1}),
    ("step", {"index": 3, "time_s": float("nan")}),
    ("step", {"index": 3, "time_s": 0.1, "phases": {"data_s": "x"}}),
    ("step", {"index": 2**70, "time_s": 0.1}),
    ("step", {"index": -1, "time_s": 0.1}),
    ("step", {"time_s": 0.1}),
    ("run", {"script": "x", "argv": "not a list"}),
    ("run", {"script": "x", "argv": [], "world_size": 0}),
    ("event", {"name": "apply_result", "data": {"status": "kept", "at_step": "5"}}),
    ("event", {"name": "warning", "data": {"message": ["x"]}}),
        ("event", {"name": "x", "data": {"deep": json.loads("[" * 40 + "]" * 40)}}),
    ("op", {"step": 1, "name": "aten.mm", "input_shapes": [[1, "2"]]}),
    ("nonsense", {}),
    (["step"], {}),
    ("step", [1, 2]),
])
def test_wrong_field_types_are_refused(kind, data):
    with pytest.raises(RecordError):
        parse_record(kind, data)


def test_good_records_pass_with_unknown_fields_ignored():
    sample = StepSample(index=3, time_s=0.5, loss=-1.5, phases={"data_s": 0.1})
    assert parse_record("step", {**sample.to_dict(), "added_later": 1}) == sample
    assert parse_record("step", {"index": 1, "time_s": 1}).time_s == 1  # a JSON integer is a number


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_server_drops_a_malformed_record_and_keeps_receiving():
    from advisor.agent.channel import AgentChannel

    secret = new_secret()
    received = []
    server = ChannelServer(secret, received.append)
    channel = AgentChannel(server.path, secret, spill_path=None)
    try:
        channel.emit({"kind": "step", "data": StepSample(index=0, time_s=0.1).to_dict()})
        channel.emit({"kind": "exit", "data": {"rank": 0, "code": 1, "reason": ["a"]}})
        channel.emit({"kind": "step", "data": StepSample(index=1, time_s=0.1).to_dict()})
        _wait(lambda: len(received) == 2)
        assert [r.index for r in received] == [0, 1]
        assert server.rejected == 1 and "exit.reason" in server.last_rejection
    finally:
        channel.close(2)
        server.close()


def test_a_stored_malformed_record_is_dropped_on_load_with_a_warning():
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, finished=True, exit_code=0, exit_reason="completed")
    for index in range(3):
        store.put(StepSample(index=index, time_s=0.1))
    store.close()
    with sqlite3.connect(folder / DB_NAME) as conn:  # what an agent of another version could leave
        conn.execute("INSERT INTO records(received, kind, rank, step, data) VALUES (0, 'event', 0, 1, ?)",
                     (json.dumps({"name": "apply_result", "data": ["not", "a", "dict"]}),))
        conn.execute("INSERT INTO records(received, kind, rank, step, data) VALUES (0, 'exit', 0, 1, ?)",
                     (json.dumps({"rank": 0, "code": 0, "reason": ["a"]}),))
        conn.execute("INSERT INTO step_records(rank, data) VALUES (0, ?)",
                     (json.dumps(StepSample(index=3, time_s=0.1).to_dict()),))
    state = load_state(folder / DB_NAME)
    assert [s.index for s in state.steps[0]] == [0, 1, 2, 3]
    report = build_report(state)
    assert any("2 malformed record(s) dropped" in w for w in report["warnings"])
    assert report["run"]["exit"]["code"] == 0


def test_exit_with_a_list_reason_no_longer_reaches_the_state():
    with pytest.raises(RecordError):
        parse_record("exit", {"rank": 0, "code": 0, "reason": ["a"]})
    assert parse_record("exit", ExitInfo(rank=0, code=0, reason="completed").to_dict()).reason == "completed"
