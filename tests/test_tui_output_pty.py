"""The real ``advisor attach`` TUI on an 80x24 pseudo-terminal, read back as a person sees it: the
script's output lines stream into the Output view while it trains, the footer shows the apply key,
the terminal says where the output is once the UI closes, and that file holds exactly what
``python SCRIPT`` prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pty_terminal import Terminal

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "scripts" / "tiny_train.py")
ARGS = ["--steps", "60", "--sleep", "0.1"]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def newest(screen: str) -> int:
    return max(int(n) for n in re.findall(r"step (\d+) loss", screen))


def test_a_live_run_shows_the_scripts_lines_at_80x24_and_keeps_them_byte_for_byte(tmp_path: Path) -> None:
    home = tmp_path / "home"
    term = Terminal([sys.executable, "-m", "advisor", "attach", "--probes", "none", TINY, *ARGS],
                    columns=80, rows=24, cwd=ROOT, env={"ADVISOR_HOME": str(home)})
    try:
        term.wait_for(r"step \d+ ")  # the UI is up and steps arrive
        assert re.search(r"\ba Apply\b", term.screen.display[-1]), term.text()  # the footer's last row
        term.press(b"8")
        term.wait_for(r"\d+ lines? · all of it:")  # the Output view
        term.wait_for(r"step \d+ loss [0-9.e-]+")
        assert "Training ended" not in term.text()  # streamed while it trains, not replayed at the end
        first = newest(term.text())
        term.wait_for(rf"step {first + 1} loss")  # newer lines arrive in the view as they are printed
        term.wait_for(r"Training ended")
        term.wait_for(r"step 59 loss [0-9.e-]+")  # the last line is on screen
        assert re.search(r"\ba Apply\b", term.screen.display[-1])
        shown = len(term.raw)
        term.press(b"q")  # finished: q closes the UI
        assert term.wait_exit() == 0
    finally:
        term.close()
    after = term.plain_since(shown)
    log = next((home / "sessions").iterdir()) / "output.log"
    assert "advisor: the script's last output (5 lines):" in after and "step 59 loss" in after
    assert f"the script's whole output (stdout and stderr) is in {log}" in after
    bare = subprocess.run([sys.executable, TINY, *ARGS], cwd=ROOT, capture_output=True, timeout=120)
    assert bare.returncode == 0 and bare.stderr == b""
    assert log.read_bytes() == bare.stdout  # the script's output untouched, byte for byte
