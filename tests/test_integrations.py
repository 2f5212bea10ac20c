"""The trainer callbacks (issue 35, item 2): a Hugging Face ``Trainer`` and a Lightning ``Trainer``,
each training a tiny model built from a config (nothing downloaded) with ``AdvisorCallback``, in
a process of its own (tests/scripts/hf_trainer.py, tests/scripts/lightning_trainer.py). The
session must hold every one of the trainer's steps, with the trainer's own loss for each, a
diagnosis, and the run must train as it does without the callback. Skipped where the trainer's
package is not installed (``pip install 'advisor[hf]'`` / ``'advisor[lightning]'``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOTTLENECKS = {"memory", "compute", "communication", "input", "launch_overhead", "none"}
# Under gradient accumulation the Trainer sums the micro-batches' losses in float32, the session in
# float64 (StepSample.loss): the same sum, a float32 rounding apart.
FLOAT32_SUM = 1e-6

pytestmark = pytest.mark.slow


def needs(package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"{package} is not installed (pip install the advisor's extra)")


def train(tmp_path: Path, script: str, *args: str) -> dict:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONHASHSEED": "0"}
    result = tmp_path / f"result-{len(list(tmp_path.glob('result-*')))}.json"
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / script), *args, "--result", str(result)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(result.read_text())


def report(session_id: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{session_id}.json"
    done = subprocess.run([sys.executable, "-m", "advisor", "report", session_id, "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def check_session(recorded: dict, trainer_losses: list[float], *, steps: int, micro_batches: int) -> None:
    assert [s["index"] for s in recorded["steps"]] == list(range(steps))  # the trainer's steps, no more
    assert all(s["micro_batches"] == micro_batches for s in recorded["steps"])
    losses = [s["loss"] for s in recorded["steps"]]
    if micro_batches == 1:
        assert losses == trainer_losses  # the trainer's own loss, bit for bit
    else:
        assert losses == pytest.approx(trainer_losses, rel=FLOAT32_SUM)
    assert recorded["diagnosis"]["bottleneck"] in BOTTLENECKS and recorded["diagnosis"]["summary"]
    assert recorded["run"]["exit"]["code"] == 0
    assert not [w for w in recorded["warnings"] if "trainer took" in w or "probe" in w], recorded["warnings"]


@needs("transformers")
@pytest.mark.parametrize("accumulate", [1, 2])
def test_hugging_face_trainer_callback(tmp_path: Path, accumulate: int) -> None:
    args = ["--steps", "8", "--accumulate", str(accumulate), "--output", str(tmp_path / "out")]
    bare = train(tmp_path, "hf_trainer.py", *args, "--bare")
    run = train(tmp_path, "hf_trainer.py", *args)
    assert run["losses"] == bare["losses"]  # the callback changes nothing the Trainer computes
    assert run["global_step"] == run["trainer_steps"] == 8
    logged = [run["losses"][str(step)] for step in range(1, 9)]  # Trainer logs at global steps 1..8
    recorded = report(run["session"], tmp_path)
    check_session(recorded, logged, steps=8, micro_batches=accumulate)
    assert [o["name"] for o in recorded["run"]["optimizers"]] == ["AdamW"]  # not accelerate's wrapper too
    assert [m["name"] for m in recorded["run"]["models"]] == ["GPT2LMHeadModel"]


@needs("lightning")
def test_lightning_callback(tmp_path: Path) -> None:
    bare = train(tmp_path, "lightning_trainer.py", "--steps", "8", "--bare")
    run = train(tmp_path, "lightning_trainer.py", "--steps", "8")
    assert run["losses"] == bare["losses"]
    assert run["global_step"] == run["trainer_steps"] == 8
    check_session(report(run["session"], tmp_path), run["losses"], steps=8, micro_batches=1)
