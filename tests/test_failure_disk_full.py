"""A full disk under ``$ADVISOR_HOME``: the store says so once, the controller warns on the terminal
and in the report, memory stays bounded, the session still records how it ended, and the exit
code is the script's. Before, the writer thread died with a traceback, the run said "completed",
a later report showed 5 of 30 steps and ``advisor sessions`` said "running or interrupted"."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console

import advisor.store as store_module
from advisor.listing import print_sessions
from advisor.paths import DB_NAME, new_session_dir
from advisor.records.samples import StepSample
from advisor.store import RESERVE_NAME, STORE_SPILL, SessionStore, load_state, read_meta

ROOT = Path(__file__).resolve().parents[1]
FULL = "database or disk is full"


def _failing_from(monkeypatch, first: int) -> None:
    """The store's inserts fail as SQLite fails on a full disk, from step ``first`` on."""
    insert = store_module._insert

    def full(conn, record, *steps):
        if isinstance(record, StepSample) and record.index >= first:
            raise sqlite3.OperationalError(FULL)
        insert(conn, record, *steps)

    monkeypatch.setattr(store_module, "_insert", full)


def _record(failures: list[str], steps: int = 30) -> Path:
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME, on_failure=failures.append)
    store.set_meta(session_id=folder.name, script="t.py", created=1.0, nproc_per_node=1, finished=False)
    assert (folder / RESERVE_NAME).is_file()
    for index in range(steps):
        store.put(StepSample(index=index, time_s=0.1))
    store.set_meta(finished=True, exit_code=0, exit_reason="completed")
    store.close()
    assert not (folder / RESERVE_NAME).exists()
    return folder / DB_NAME


def test_a_failed_write_is_said_once_spilled_and_the_end_state_still_recorded(monkeypatch):
    _failing_from(monkeypatch, 5)
    failures: list[str] = []
    db = _record(failures)
    assert failures == [f"OperationalError: {FULL}"]  # once, not per batch
    meta = read_meta(db)
    assert meta["finished"] is True and meta["exit_code"] == 0  # not "running or interrupted" forever
    assert meta["store_error"]["error"] == failures[0] and meta["store_error"]["records_lost"] == 0
    assert (db.parent / STORE_SPILL).is_file()
    state = load_state(db)
    assert [s.index for s in state.steps[0]] == list(range(30))  # stored, then spilled: nothing lost
    assert any("could not be written" in e.data.get("message", "") for e in state.events if e.name == "warning")


def test_with_no_room_to_spill_the_lost_records_are_counted_and_sessions_says_so(monkeypatch):
    _failing_from(monkeypatch, 0)
    monkeypatch.setattr(store_module, "_free_bytes", lambda folder: 0)
    db = _record([])
    error = read_meta(db)["store_error"]
    assert error["records_lost"] == 30 and error["spill"] is None
    [warning] = [e.data["message"] for e in load_state(db).events if e.name == "warning"]
    assert "30 record(s) were lost" in warning
    out = io.StringIO()
    print_sessions(Console(file=out, width=300))
    assert "exit 0: completed; store incomplete" in out.getvalue()


def test_nothing_is_queued_past_the_bound_while_the_writer_is_stuck(monkeypatch):
    monkeypatch.setattr(store_module, "MAX_QUEUED", 10)
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    entered, release = threading.Event(), threading.Event()

    def stuck(records, meta):  # a write that does not return (a disk that hangs)
        entered.set()
        release.wait(10)

    monkeypatch.setattr(store, "_commit", stuck)
    store.set_meta(session_id=folder.name)
    assert entered.wait(10)
    for index in range(100):
        store.put(StepSample(index=index, time_s=0.1))
    assert store._queue.qsize() == 10 and store.lost == 90  # counted, not held
    release.set()
    store.close()


@pytest.fixture
def tiny_home(tmp_path):
    """A 400 KiB tmpfs as $ADVISOR_HOME (root only): the store fills it within a few steps."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k,mode=0700", "tmpfs", str(mount)],
                          capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()[:200]}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.slow
def test_attach_on_a_full_disk_warns_keeps_the_exit_code_and_marks_the_end(tiny_home, tmp_path):
    env = {**os.environ, "ADVISOR_HOME": str(tiny_home)}
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--steps", "30",
                          "--json", str(tmp_path / "r.json"), "examples/slow_input.py", "--steps", "30",
                          "--load-ms", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]  # the script succeeded: so does the advisor
    assert "Traceback" not in run.stderr
    assert f"warning: cannot write the session store (OperationalError: {FULL})" in run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["steps_total"] == 30  # this run's report has every step
    assert any("cannot write the session store" in w for w in report["warnings"])
    listing = subprocess.run([sys.executable, "-m", "advisor", "sessions"], cwd=ROOT, capture_output=True,
                             text=True, env={**env, "COLUMNS": "300"}, timeout=120)
    assert "exit 0: completed; store incomplete" in listing.stdout, listing.stdout
    later = subprocess.run([sys.executable, "-m", "advisor", "report", "latest", "--json", str(tmp_path / "l.json")],
                           cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert later.returncode == 0, later.stderr
    assert any("the session store could not be written" in w
               for w in json.loads((tmp_path / "l.json").read_text())["warnings"])
