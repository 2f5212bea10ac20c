"""The real ``advisor attach`` TUI on a pseudo-terminal: q then s stops the job; a closed terminal
does not, and the job is still recorded."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "scripts" / "tiny_train.py")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _spawn(tmp_path: Path, *script_args: str) -> tuple[int, int]:
    """``advisor attach`` in a child whose controlling terminal is a new pty; (pid, master fd)."""
    argv = [sys.executable, "-m", "advisor", "attach", "--probes", "none", "--json", str(tmp_path / "r.json"),
            TINY, *script_args]
    pid, master = pty.fork()
    if pid == 0:  # the child: the pty is its terminal
        os.chdir(ROOT)
        os.environ["ADVISOR_HOME"] = str(tmp_path / "home")
        os.environ["TERM"] = "xterm-256color"
        os.execv(sys.executable, argv)
    return pid, master


def _drain(master: int, seconds: float) -> bytes:
    """Read what the UI draws for a while (a pty's writer blocks when nobody reads)."""
    out = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                out += os.read(master, 65536)
            except OSError:
                break
    return out


def _wait_file(path: Path, master: int | None, timeout: float = 120, containing: str = "") -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text() and containing in path.read_text():
            return path.read_text()
        if master is not None:
            _drain(master, 0.1)
        else:
            time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _wait_exit(pid: int, master: int | None, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if master is not None:
            _drain(master, 0.1)
        else:
            time.sleep(0.1)
    raise AssertionError("the controller did not exit")


def test_q_then_s_stops_the_training_and_writes_the_report(tmp_path) -> None:
    pid_file = tmp_path / "pid"
    pid, master = _spawn(tmp_path, "--steps", "100000", "--sleep", "0.02", "--pid-file", str(pid_file))
    training = int(_wait_file(pid_file, master))
    _drain(master, 3.0)  # the UI is up and a few steps ran
    os.write(master, b"q")
    _drain(master, 1.0)
    os.write(master, b"s")
    code = _wait_exit(pid, master)
    os.close(master)
    assert code == 143  # the script's own code: stopped by SIGTERM
    assert not _alive(training)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["run"]["exit"]["reason"].endswith("the user stopped the job from the TUI (q, then s)")


def test_closing_the_terminal_leaves_training_running_and_recorded(tmp_path) -> None:
    pid_file = tmp_path / "pid"
    pid, master = _spawn(tmp_path, "--steps", "100000", "--sleep", "0.02", "--pid-file", str(pid_file))
    training = int(_wait_file(pid_file, master))
    _drain(master, 3.0)
    os.close(master)  # the terminal goes away: SIGHUP to its processes
    sessions = tmp_path / "home" / "sessions"
    log = next(iter(sessions.iterdir())) / "controller.log"
    assert "training continues and is recorded" in _wait_file(log, None, timeout=60, containing="terminal closed")
    time.sleep(2.0)
    assert _alive(training) and _alive(pid)  # training goes on, and the advisor still records it
    os.kill(pid, signal.SIGTERM)  # the advisor stops it as at any SIGTERM, and reports
    code = _wait_exit(pid, None)
    assert code == 143 and not _alive(training)
    report = json.loads((tmp_path / "r.json").read_text())
    assert "the advisor received SIGTERM" in report["run"]["exit"]["reason"]
    steps = [s["index"] for s in report["steps"]]
    assert steps == list(range(len(steps))) and len(steps) > 20  # recorded through the hangup, none lost


def test_q_then_l_leaves_the_training_running_and_recorded(tmp_path) -> None:
    pid_file = tmp_path / "pid"
    # 1000 steps of at least 20 ms: the job must outlive the ~7 s of keys and drawing below (300
    # steps ended first under load, and the "still alive" check failed on a job that had finished).
    pid, master = _spawn(tmp_path, "--steps", "1000", "--sleep", "0.02", "--pid-file", str(pid_file))
    training = int(_wait_file(pid_file, master))
    _drain(master, 3.0)
    os.write(master, b"q")
    _drain(master, 1.0)
    os.write(master, b"l")
    shown = _drain(master, 3.0).decode(errors="replace")
    assert "UI closed; training continues and is recorded" in shown
    assert _alive(training)
    code = _wait_exit(pid, master, timeout=240)  # the job runs to its own end, followed headless
    os.close(master)
    assert code == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["steps"]) == 1000 and report["run"]["exit"]["code"] == 0


def test_advisor_open_browses_a_stored_session_and_quits(tmp_path) -> None:
    from recorded import write_session

    write_session("ddp", tmp_path / "home")
    pid, master = pty.fork()
    if pid == 0:
        os.chdir(ROOT)
        os.environ["ADVISOR_HOME"] = str(tmp_path / "home")
        os.environ["TERM"] = "xterm-256color"
        os.execv(sys.executable, [sys.executable, "-m", "advisor", "open", "latest"])
    shown = _drain(master, 6.0)
    for key in (b"2", b"4", b"5", b"]"):
        os.write(master, key)
        shown += _drain(master, 1.0)
    os.write(master, b"q")  # a recorded session: q closes at once
    assert _wait_exit(pid, master) == 0
    os.close(master)
    text = shown.decode(errors="replace")
    assert "straggler" in text and "rank 0" in text
