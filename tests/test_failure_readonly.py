"""Reading a session opens it read-only: no file is changed, renamed or created beside it."""

import errno
import hashlib
import io
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
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


# -- a read-only home ---------------------------------------------------------------------------
# Before, paths.py made and chmodded the sessions folder on every command: on a read-only home
# (a shared, a mounted or an archived one) even `advisor report /path/to/session` failed with
# OSError: [Errno 30].


def _recorded_home(home: Path) -> tuple[str, str]:
    """Two recorded sessions (tests/data) stored under ``home``; their ids."""
    from recorded import write_session

    return write_session("gpt", home).parent.name, write_session("ddp", home).parent.name


def _read_everything(home: Path, ids: tuple[str, str], out: Path, monkeypatch, capsys) -> None:
    """report (by id, by folder, latest), sessions, diff and open: each works and writes only to ``out``."""
    from advisor import open_cli

    a, b = ids
    assert main(["sessions"]) == 0
    assert a in capsys.readouterr().out
    assert main(["report", a, "--json", str(out / "a.json")]) == 0
    assert json.loads((out / "a.json").read_text())["summary"]["steps"] > 0
    assert main(["report", str(home / "sessions" / b), "--format", "markdown"]) == 0
    assert main(["report", "latest", "--json", str(out / "latest.json")]) == 0
    assert main(["diff", a, b, "--json", str(out / "diff.json")]) == 0
    opened = []
    monkeypatch.setattr(open_cli.tui, "make_app", lambda source, **kw: opened.append(source.snapshot()) or _NoUI())
    monkeypatch.setattr(open_cli.sys, "stdin", _Terminal())
    monkeypatch.setattr(open_cli.sys, "stdout", _Terminal())
    assert main(["open", a]) == 0
    assert opened and opened[0].steps
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error" not in err, err


class _NoUI:
    def run(self) -> None:
        return None


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_read_paths_never_write_under_the_home(tmp_path, monkeypatch, capsys):
    """Every write the os module could make under the home fails as on a read-only filesystem
    (EROFS): a read path that tries one fails the test. (Root ignores chmod; this does not.)"""
    home = Path(os.environ["ADVISOR_HOME"])
    ids = _recorded_home(home)
    out = tmp_path / "out"
    out.mkdir()
    before = {p: _fingerprint(p) for p in (home / "sessions").iterdir()}
    inside = lambda path: str(os.path.abspath(os.fspath(path))).startswith(str(home))

    def refuse(real):
        def call(path, *args, **kwargs):
            if inside(path):
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return real(path, *args, **kwargs)
        return call

    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, flags, *a, **k: (
        refuse(real_open)(path, flags, *a, **k) if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        else real_open(path, flags, *a, **k)))
    for name in ("mkdir", "chmod", "rename", "replace", "unlink", "rmdir"):
        monkeypatch.setattr(os, name, refuse(getattr(os, name)))
    _read_everything(home, ids, out, monkeypatch, capsys)
    monkeypatch.undo()
    assert {p: _fingerprint(p) for p in (home / "sessions").iterdir()} == before


@pytest.fixture
def read_only_home(tmp_path):
    """$ADVISOR_HOME with two recorded sessions, then made read-only: a read-only bind mount as
    root (whom chmod does not stop), chmod a-w otherwise."""
    home = Path(os.environ["ADVISOR_HOME"])
    ids = _recorded_home(home)
    if os.geteuid() != 0:
        for path in [home, *home.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        yield home, ids
        for path in [home, *home.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
        return
    bound = subprocess.run(["mount", "--bind", str(home), str(home)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.decode().strip()[:200]}")
    try:
        remounted = subprocess.run(["mount", "-o", "remount,bind,ro", str(home)], capture_output=True)
        if remounted.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {remounted.stderr.decode().strip()[:200]}")
        with pytest.raises(OSError):
            (home / "probe").touch()  # read-only, for root too
        yield home, ids
    finally:
        subprocess.run(["umount", str(home)], capture_output=True)


def test_report_sessions_open_and_diff_work_on_a_read_only_home(read_only_home, tmp_path, monkeypatch, capsys):
    home, ids = read_only_home
    out = tmp_path / "out"
    out.mkdir()
    _read_everything(home, ids, out, monkeypatch, capsys)
