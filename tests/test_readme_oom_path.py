"""The README's "from a job that does not fit to one that does" commands, run in the order written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Four real runs of examples/gpt.py: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def readme_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"From a job that does not fit to one that does:\n\n```\n(.*?)```", text, re.S)
    assert block, "the README's OOM-to-fit block moved"
    return [shlex.split(line) for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_readme_oom_to_fit_steps_work_in_order(tmp_path: Path) -> None:
    commands = readme_commands()
    assert [c[1] for c in commands] == ["attach", "attach", "plan", "attach"]
    env = dict(os.environ)
    runs = []
    for i, command in enumerate(commands):
        assert command[0] == "advisor"
        argv = [str(tmp_path / a) if a == "plan.json" else a for a in command[1:]]
        if argv[0] == "attach":
            argv[1:1] = ["--json", str(tmp_path / f"r{i}.json")]
        runs.append(subprocess.run([sys.executable, "-m", "advisor", *argv], cwd=ROOT, env=env,
                                   capture_output=True, text=True, timeout=600))
    oom, live_apply, plan, planned = runs
    assert oom.returncode != 0 and "OutOfMemoryError" in oom.stderr  # 1. it runs out of memory
    first = json.loads((tmp_path / "r0.json").read_text())
    assert first["memory"]["oom"] is not None
    assert live_apply.returncode == 0, live_apply.stderr[-2000:]  # 2a. applied live and kept
    applied = json.loads((tmp_path / "r1.json").read_text())["applied"]
    assert applied and applied[0]["status"] == "kept"
    # 2b. `advisor plan` with no session picks the session that ran out of memory, not 2a's.
    assert plan.returncode == 0, plan.stderr
    assert f"planning from session {first['session']['id']}: it ran out of memory" in plan.stderr
    assert (tmp_path / "plan.json").is_file()
    assert planned.returncode == 0, planned.stderr[-2000:]
    last = json.loads((tmp_path / "r3.json").read_text())
    assert last["memory"]["oom"] is None
    assert last["memory"]["peak_bytes"] <= last["memory"]["budget_bytes"]
    assert last["applied"] and last["applied"][0]["status"] == "kept"
