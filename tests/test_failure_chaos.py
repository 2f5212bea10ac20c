"""Chaos on 2 gloo ranks: a rank raises, calls os._exit, or is SIGKILLed; the controller is
SIGKILLed or SIGTERMed. The report names the right rank and code, nothing recorded before the
failure is lost, and `advisor sessions` and `advisor report` still work afterwards."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "scripts" / "rank_fail.py")


def _advisor(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "advisor", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def _wait(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of a dead parent counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _reported(tmp_path) -> dict:
    """`advisor sessions` and `advisor report` on the one session, both working."""
    listing = subprocess.run([sys.executable, "-m", "advisor", "sessions"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    out = tmp_path / "again.json"
    report = subprocess.run([sys.executable, "-m", "advisor", "report", "latest", "--json", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    shown = subprocess.run([sys.executable, "-m", "advisor", "report", "latest"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    return json.loads(out.read_text())


def _steps(report: dict, rank: int) -> list[int]:
    return [s["index"] for s in report["steps"] if s["rank"] == rank]


@pytest.mark.slow
@pytest.mark.parametrize("how, code, says", [
    ("raise", 1, "rank 1 failed with ValueError: could not open shard [/data/shard-1]"),
    ("exit", 9, "rank 1 exited with code 9"),
    ("kill", 137, "rank 1 killed by SIGKILL"),
])
def test_a_failing_rank_is_named_with_its_own_code(tmp_path, how, code, says):
    out = tmp_path / "r.json"
    proc = _advisor("attach", "--headless", "--probes", "none", "--nproc-per-node", "2", "--json", str(out),
                    SCRIPT, "--fail-rank", "1", "--fail-at", "3", "--how", how)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == code, err[-3000:]
    report = json.loads(out.read_text())
    assert report["run"]["exit"]["code"] == code
    assert report["run"]["exit"]["reason"].startswith(says), report["run"]["exit"]["reason"]
    assert "after step 2" in report["run"]["exit"]["reason"]
    assert _steps(report, 1) == [0, 1, 2]  # everything rank 1 recorded before it failed
    assert _steps(report, 0)[:3] == [0, 1, 2]
    again = _reported(tmp_path)
    assert again["run"]["exit"] == report["run"]["exit"] and _steps(again, 1) == [0, 1, 2]


@pytest.mark.slow
def test_sigkill_of_the_controller_loses_nothing_and_the_session_recovers(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = _advisor("attach", "--headless", "--probes", "none", "--nproc-per-node", "2", SCRIPT,
                    "--steps", "30", "--sleep", "0.1", "--pid-dir", str(pids))
    _wait(lambda: len(list(pids.iterdir())) == 2)
    ranks = [int(p.read_text()) for p in sorted(pids.iterdir())]
    proc.kill()  # the controller dies; the ranks must not
    proc.communicate(timeout=60)
    _wait(lambda: not any(_alive(pid) for pid in ranks))
    report = _reported(tmp_path)
    assert _steps(report, 0) == list(range(30)) and _steps(report, 1) == list(range(30))
    assert report["run"]["exit"]["code"] == 0  # finished, from the ranks' spilled exit records
    assert "recovered" in report["run"]["exit"]["reason"]
    session = Path(report["session"]["path"])
    assert not (session / "secret").exists()


@pytest.mark.slow
def test_sigterm_to_the_controller_stops_both_ranks_and_reports(tmp_path):
    pids, out = tmp_path / "pids", tmp_path / "r.json"
    pids.mkdir()
    proc = _advisor("attach", "--headless", "--probes", "none", "--nproc-per-node", "2", "--json", str(out),
                    SCRIPT, "--steps", "100000", "--sleep", "0.05", "--pid-dir", str(pids))
    _wait(lambda: len(list(pids.iterdir())) == 2)
    ranks = [int(p.read_text()) for p in sorted(pids.iterdir())]
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert "received SIGTERM: stopping the training job" in err
    assert not any(_alive(pid) for pid in ranks)
    report = json.loads(out.read_text())
    assert proc.returncode == report["run"]["exit"]["code"] != 0
    assert "the advisor received SIGTERM" in report["run"]["exit"]["reason"]
    assert _steps(report, 0)[:1] == [0] and _steps(report, 1)[:1] == [0]
    again = _reported(tmp_path)
    assert again["run"]["exit"]["code"] == report["run"]["exit"]["code"]
    assert len(again["steps"]) == len(report["steps"])
