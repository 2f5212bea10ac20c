"""End to end: ``advisor attach --headless --apply dataloader-workers`` on examples/slow_input.py
cuts its data wait live and keeps the losses (samples depend on their index only, and the
batch order is kept)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
ARGS = ["--steps", "20", "--load-ms", "10"]  # 160 ms of loading per batch: input-bound even under load


def test_dataloader_workers_applied_live_cut_the_data_wait_and_keep_the_losses(tmp_path) -> None:
    bare = subprocess.run([sys.executable, "examples/slow_input.py", *ARGS], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=True).stdout
    bare_losses = [float(line.split()[3]) for line in bare.splitlines() if line.startswith("step ")]
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--apply", "dataloader-workers",
                          "--apply-at-step", "5", "--allow-inexact", "--steps", "20", "--json", str(out),
                          "examples/slow_input.py", *ARGS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [s["loss"] for s in report["steps"]] == bare_losses
    [applied] = report["applied"]
    assert applied["remedy"] == "dataloader" and applied["status"] == "kept", applied
    assert applied["at_step"] >= 5 and applied["params"]["num_workers"] >= 1
    wait = {s["index"]: s["phases"]["data_s"] for s in report["steps"]}
    before = [wait[i] for i in range(1, applied["at_step"])]
    after = [wait[i] for i in applied["measured"]["after"]["time_steps"]]
    # The loading now overlaps the step. Two workers (this machine's cores) deliver batches in
    # pairs, a wait of ~150 ms then none: the mean wait about halves, and a median of three read
    # one step or the other by the window's parity
    assert statistics.fmean(after) < 0.75 * statistics.fmean(before)
