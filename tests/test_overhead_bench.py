"""``bench/overhead.py --split``: its "agent, no controller" configuration runs the training
process's agent with the settings ``advisor attach`` gives it, not a bare process."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import overhead  # noqa: E402


def _args(tmp_path: Path, probes: str | None) -> argparse.Namespace:
    script = tmp_path / "loop.py"
    script.write_text(
        "import argparse, torch\n"
        "p = argparse.ArgumentParser(); p.add_argument('--steps', type=int); n = p.parse_args().steps\n"
        "torch.manual_seed(0); model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(n):\n"
        "    loss = model(torch.randn(8, 4)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()\n"
        "    print(f'step {i} loss {loss.item()!r}', flush=True)\n")
    return argparse.Namespace(script=script, steps=6, script_args="", probes=probes, split=True)


def test_split_runs_the_agent_alone(tmp_path: Path) -> None:
    args = _args(tmp_path, "none")
    label, cmd = overhead.configurations(args)[-1]
    assert label == overhead.ALONE
    env = {**os.environ, "ADVISOR_HOME": str(tmp_path / "home"),
           **overhead.alone_env(args, tmp_path / "session")}
    assert json.loads(env["ADVISOR_CONFIG"])["probes"] == []  # --probes none, as attach would pass it
    assert (tmp_path / "session").stat().st_mode & 0o777 == 0o700
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sum(line.startswith("step ") for line in done.stdout.splitlines()) == 6  # the script's own lines
    # No controller: the agent spilled what it recorded, one step sample per step the script ran.
    spilled = [json.loads(line) for line in (tmp_path / "session" / "spill-rank0.jsonl").read_text().splitlines()]
    steps = {r["data"]["index"] for r in spilled if r["kind"] == "step"}
    assert steps == set(range(6)), sorted(steps)


def test_split_passes_the_probes_given(tmp_path: Path) -> None:
    assert json.loads(overhead.alone_env(_args(tmp_path, "memory,comm"), tmp_path / "a")["ADVISOR_CONFIG"])["probes"] \
        == ["memory", "comm"]
    default = json.loads(overhead.alone_env(_args(tmp_path, None), tmp_path / "b")["ADVISOR_CONFIG"])
    assert default["probes"] == ["memory", "compute", "comm"] and default["max_steps"] == 6
