"""The script's output is untouched under ``advisor attach``, and the advisor's own goes elsewhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "scripts" / "tiny_train.py")


def _run(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, timeout=240)


@pytest.mark.slow
def test_stdout_is_byte_for_byte_the_scripts_own(tmp_path: Path) -> None:
    bare = _run(TINY, "--steps", "6")
    # No --headless and no terminal (stdout is a pipe): attach falls back to headless and says so.
    attached = _run("-m", "advisor", "attach", TINY, "--steps", "6")
    assert bare.returncode == 0 and attached.returncode == 0, attached.stderr.decode()
    assert attached.stdout == bare.stdout
    err = attached.stderr.decode()
    assert "no terminal" in err and "running headless" in err
    assert "USDT" not in err and "profiler_start" not in err  # the profiler's log lines are silenced
    assert "Memory at peak" in err  # the final report went to stderr, not the script's stdout
    assert "\x1b[" not in err  # no escape codes in a file or a pipe


@pytest.mark.slow
def test_report_file_in_markdown(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    run = _run("-m", "advisor", "attach", "--headless", "--report", str(out), "--format", "markdown",
               TINY, "--steps", "6")
    assert run.returncode == 0, run.stderr.decode()
    text = out.read_text()
    assert text.startswith("# advisor report: session ")
    assert "## Memory at peak:" in text and "| category | at peak | max |" in text
    assert "Memory at peak" not in run.stderr.decode()  # written to the file instead
    assert f"wrote report {out}" in run.stderr.decode()
