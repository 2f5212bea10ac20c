"""Reading a session opens it read-only: no file is changed, renamed or created beside it."""

import hashlib
import io
import json
import os
import time
from pathlib import Path

from rich.console import Console

from advisor.cli import main
from advisor.listing import print_sessions
from advisor.paths import DB_NAME, new_session_dir
from advisor.records.samples import RunInfo, StepSample
from advisor.store import SessionStore, load_state, read_meta


def _fingerprint(folder: Path) -> dict[str, tuple[str, float]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime)
            for p in sorted(folder.iterdir())}


def _finished_session(steps: int = 3) -> Path:
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, script="t.py", created=0.0, finished=True, exit_code=0,
                   exit_reason="completed")
    for index in range(steps):
        store.put(StepSample(index=index, time_s=0.1))
    store.close()
    return folder / DB_NAME


def test_report_on_a_zero_byte_file_leaves_it_as_it_was(tmp_path, capsys):
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    assert main(["report", str(empty)]) == 3
    assert "not a readable advisor session" in capsys.readouterr().err
    assert empty.stat().st_size == 0
    assert sorted(os.listdir(tmp_path)) == ["empty.sqlite"]  # a read path creates nothing, not even the home


def test_reading_a_finished_session_creates_and_changes_nothing(tmp_path):
    db = _finished_session()
    before = _fingerprint(db.parent)
    assert len(load_state(db).steps[0]) == 3
    assert read_meta(db)["finished"] is True
    print_sessions(Console(file=io.StringIO()))
    out = tmp_path / "r.json"
    assert main(["report", str(db), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["summary"]["steps"] == 3
    assert _fingerprint(db.parent) == before  # no -wal, -shm, journal or rename


def test_a_live_session_is_read_through_its_wal():
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)  # the writer stays connected: its commits sit in the WAL
    try:
        store.set_meta(session_id=folder.name)
        store.put(RunInfo(script="t.py", argv=[]))
        store.put(StepSample(index=0, time_s=0.1))
        deadline = time.monotonic() + 10
        state = load_state(folder / DB_NAME)
        while not state.steps and time.monotonic() < deadline:
            time.sleep(0.02)
            state = load_state(folder / DB_NAME)
        assert (folder / (DB_NAME + "-wal")).exists()
        assert [s.index for s in state.steps[0]] == [0]
        assert not state.finished
    finally:
        store.close()
