"""SIGTERM or SIGHUP to the controller stops the job deliberately: said, recorded, reported."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "scripts" / "tiny_train.py")


def _wait_for(path: Path, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_controller_stops_and_reports_the_job(tmp_path, signum):
    pid_file, out = tmp_path / "pid", tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "attach", "--headless", "--probes", "none",
                             "--json", str(out), TINY, "--steps", "100000", "--sleep", "0.02",
                             "--pid-file", str(pid_file)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    training = int(_wait_for(pid_file))
    while not proc.stdout.readline().startswith("step 3 "):
        pass
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=90)
    name = signal.Signals(signum).name
    assert f"received {name}: stopping the training job" in err
    assert proc.returncode == 143  # the script's own code: it was stopped by SIGTERM
    assert not _alive(training)  # not orphaned
    report = json.loads(out.read_text())
    assert report["run"]["exit"]["code"] == 143
    assert f"the advisor received {name}" in report["run"]["exit"]["reason"]
    assert [s["index"] for s in report["steps"]][:4] == [0, 1, 2, 3]
    listing = subprocess.run([sys.executable, "-m", "advisor", "sessions"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    assert "exit 143" in listing.stdout and "running or interrupted" not in listing.stdout
