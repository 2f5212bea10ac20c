"""``advisor attach`` end to end: the script runs as under python, failures are reported, nothing is lost."""

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "scripts" / "tiny_train.py")
SCRIPTS = ROOT / "tests" / "scripts"


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default. A shell starts a background job
    (``pytest ... &``) with SIGINT ignored, the ignore is inherited through exec, and Python then
    never raises KeyboardInterrupt: the Ctrl-C tests read exit 0 whenever the suite ran that way."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def advisor(*args, timeout=180, **kwargs):
    return subprocess.run([sys.executable, "-m", "advisor", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def printed_losses(stdout: str) -> list[float]:
    return [float(line.split()[3]) for line in stdout.splitlines() if line.startswith("step ")]


def sessions_root() -> Path:
    return Path(os.environ["ADVISOR_HOME"]) / "sessions"


def only_session() -> Path:
    found = sorted(sessions_root().glob("*/session.sqlite"))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.slow
def test_gpt_losses_match_plain_python_and_phases_add_up(tmp_path):
    bare = subprocess.run([sys.executable, "examples/gpt.py", "--steps", "20"], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, check=True)
    out = tmp_path / "r.json"
    run = advisor("attach", "--headless", "--steps", "20", "--json", str(out), "examples/gpt.py")
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["schema"] == "advisor.report/1"
    steps = [s for s in report["steps"] if s["rank"] == 0]
    assert [s["index"] for s in steps] == list(range(20))
    assert [s["loss"] for s in steps] == printed_losses(bare.stdout)
    assert printed_losses(run.stdout) == printed_losses(bare.stdout)  # the script's own output is untouched
    for s in steps:
        assert sum(s["phases"].values()) == pytest.approx(s["time_s"], rel=0.05)
    assert report["run"]["exit"] == {**report["run"]["exit"], "code": 0}
    assert "stopped after 20 steps" in report["run"]["exit"]["reason"]
    assert report["run"]["device"]["type"] == "cpu"
    assert report["run"]["models"][0]["name"] == "GPT"


@pytest.mark.slow
def test_argv_output_and_exit_code_pass_through(tmp_path):
    run = advisor("attach", "--headless", "--probes", "none", TINY, "--steps", "3", "--exit-code", "3")
    assert run.returncode == 3, run.stderr
    assert "argv ['--steps', '3', '--exit-code', '3']" in run.stdout
    assert len(printed_losses(run.stdout)) == 3
    assert "sys.exit(3)" in run.stderr


@pytest.mark.slow
def test_missing_unreadable_binary_and_syntax_error_scripts(tmp_path):
    missing = advisor("attach", "--headless", "nope.py")
    assert missing.returncode == 2
    assert missing.stderr.startswith("advisor: error: no such script: nope.py")
    assert "Traceback" not in missing.stderr
    folder = advisor("attach", "--headless", str(SCRIPTS))
    assert folder.returncode == 2 and "not a file" in folder.stderr
    binary = advisor("attach", "--headless", str(SCRIPTS / "not_python.bin"))
    assert binary.returncode == 2 and "not a Python file" in binary.stderr
    syntax = advisor("attach", "--headless", str(SCRIPTS / "syntax_error.py"))
    assert syntax.returncode == 2 and "syntax_error.py:1" in syntax.stderr  # README: 2, unusable script
    if os.geteuid() != 0:  # root reads anything
        unreadable = tmp_path / "secret.py"
        unreadable.write_text("print(1)")
        unreadable.chmod(0)
        assert advisor("attach", "--headless", str(unreadable)).returncode == 2
    assert not sessions_root().exists() or not list(sessions_root().iterdir())  # nothing recorded


@pytest.mark.slow
def test_exception_at_import_is_reported_with_the_script_frame(tmp_path):
    out = tmp_path / "r.json"
    run = advisor("attach", "--headless", "--probes", "none", "--json", str(out), str(SCRIPTS / "raise_at_import.py"))
    assert run.returncode == 1
    assert "RuntimeError: broken at import" in run.stderr  # Python's own traceback still prints
    exit_ = json.loads(out.read_text())["run"]["exit"]
    assert exit_["code"] == 1
    assert "RuntimeError: broken at import at " in exit_["reason"]
    frame = exit_["ranks"][0]["frame"]
    assert frame["file"].endswith("raise_at_import.py") and frame["line"] == 3


@pytest.mark.slow
def test_exception_at_step_keeps_earlier_steps(tmp_path):
    out = tmp_path / "r.json"
    run = advisor("attach", "--headless", "--probes", "none", "--json", str(out), TINY, "--steps", "6",
                  "--raise-at", "4")
    assert run.returncode == 1
    report = json.loads(out.read_text())
    assert [s["index"] for s in report["steps"]] == [0, 1, 2, 3]
    assert "ValueError: boom at step 4" in report["run"]["exit"]["reason"]
    assert report["run"]["exit"]["ranks"][0]["frame"]["function"] == "train_step"
    # The stored session says the same when reported later.
    again = tmp_path / "again.json"
    assert advisor("report", str(only_session()), "--json", str(again)).returncode == 0
    assert [s["loss"] for s in json.loads(again.read_text())["steps"]] == [s["loss"] for s in report["steps"]]


@pytest.mark.slow
def test_script_that_never_steps_says_so():
    run = advisor("attach", "--headless", "--probes", "none", str(SCRIPTS / "never_steps.py"))
    assert run.returncode == 0
    assert "never called an optimizer step" in run.stderr


def test_corrupted_session_file_gives_one_line_error(tmp_path):
    bad = tmp_path / "session.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    run = advisor("report", str(bad))
    assert run.returncode == 3
    assert run.stderr.startswith("advisor: error:") and "Traceback" not in run.stderr
    assert advisor("report", "no-such-session").returncode == 3


@pytest.mark.slow
def test_session_files_are_owner_only_and_listed():
    run = advisor("attach", "--headless", "--probes", "none", TINY, "--steps", "2")
    assert run.returncode == 0, run.stderr
    db = only_session()
    for path in (sessions_root(), db.parent, db):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    listing = advisor("sessions")
    assert db.parent.name in listing.stdout and "exit 0" in listing.stdout


def _wait_for(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


@pytest.mark.slow
def test_killing_the_training_process_keeps_every_step(tmp_path):
    pid_file = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "attach", "--headless", "--probes", "none",
                             TINY, "--steps", "1000", "--sleep", "0.05", "--pid-file", str(pid_file)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = int(_wait_for(pid_file))
    while True:  # wait for a few steps to print
        line = proc.stdout.readline()
        if line.startswith("step 7 "):
            break
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 137
    assert "killed by SIGKILL" in err
    report = tmp_path / "r.json"
    assert advisor("report", str(only_session()), "--json", str(report)).returncode == 0
    indices = [s["index"] for s in json.loads(report.read_text())["steps"]]
    # Steps 6 and 7 may be in flight at the kill (DESIGN: at most what is in flight is lost).
    assert indices[:6] == list(range(6)) and indices == list(range(len(indices)))


@pytest.mark.slow
def test_killing_the_controller_lets_training_finish(tmp_path):
    pid_file, done = tmp_path / "pid", tmp_path / "done"
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "attach", "--headless", "--probes", "none",
                             TINY, "--steps", "40", "--sleep", "0.05", "--pid-file", str(pid_file),
                             "--done-file", str(done)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(pid_file)
    time.sleep(0.5)
    proc.kill()  # the controller dies; the training process must not
    proc.wait()
    assert _wait_for(done, timeout=90) == "done"
    time.sleep(1.0)  # the agent flushes its spill file at exit
    report = tmp_path / "r.json"
    assert advisor("report", str(only_session()), "--json", str(report)).returncode == 0
    steps = json.loads(report.read_text())["steps"]
    assert [s["index"] for s in steps] == list(range(40))  # socket records plus the spilled rest


@pytest.mark.slow
def test_ctrl_c_interrupts_the_script_and_exits_130(tmp_path):
    pid_file = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "attach", "--headless", "--probes", "none",
                             TINY, "--steps", "1000", "--sleep", "0.05", "--pid-file", str(pid_file)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)
    _wait_for(pid_file)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted" in err


@pytest.mark.slow
def test_two_ranks_are_recorded_with_their_collectives(tmp_path):
    out = tmp_path / "r.json"
    run = advisor("attach", "--headless", "--probes", "comm", "--nproc-per-node", "2", "--steps", "10",
                  "--json", str(out), "examples/ddp.py", timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["run"]["world_size"] == 2
    assert sorted({s["rank"] for s in report["steps"]}) == [0, 1]
    for rank in (0, 1):
        assert [s["index"] for s in report["steps"] if s["rank"] == rank] == list(range(10))
    assert report["run"]["models"][0]["wrapper"] == "DistributedDataParallel"
    # DDP all-reduces every gradient once per step: bytes per step = fp32 gradient bytes.
    grad_bytes = report["run"]["models"][0]["parameter_bytes"]
    for rank in (0, 1):
        rows = [c for c in report["collectives"] if c["rank"] == rank and c["op"] == "all_reduce"]
        total = sum(c["bytes"] * c["count"] for c in rows)
        assert total % grad_bytes == 0 and total // grad_bytes >= 10, (total, grad_bytes)
        assert all(c["exposed_s"] <= c["time_s"] + 1e-9 for c in rows)
    assert {row["rank"] for row in report["comm"]} == {0, 1}


@pytest.mark.slow
def test_trace_export_has_steps_and_memory_counters(tmp_path):
    run = advisor("attach", "--headless", "--probes", "memory", "--steps", "4", TINY, "--steps", "4")
    assert run.returncode == 0, run.stderr
    trace = tmp_path / "t.json"
    assert advisor("report", "latest", "--trace", str(trace)).returncode == 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["name"] == "step 3" for e in events)
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(set(e["args"]) for e in counters)
