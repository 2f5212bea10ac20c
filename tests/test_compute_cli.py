"""Issue 4 on the real CLI: op records cover the deep steps' forward+backward time on examples/gpt.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _coverage(tmp_path, *args) -> tuple[float, dict]:
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--probes", "compute",
                          "--steps", "6", "--json", str(out), "examples/gpt.py", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    timed = report["compute"]["deep_steps"]
    steps = {s["index"]: s for s in report["steps"] if s["rank"] == 0}
    fwd_bwd = sum(steps[i]["phases"]["forward_s"] + steps[i]["phases"]["backward_s"] for i in timed) / len(timed)
    # Coverage of the profiled steps themselves: the ops as measured there, not normalised.
    covered = sum(op["profiled_time_s"] for op in report["ops"] if op["phase"] in ("forward", "backward"))
    return covered / fwd_bwd, report


@pytest.mark.slow
def test_ops_cover_forward_and_backward_of_gpt(tmp_path):
    # At gpt.py's toy defaults (20 ms forward) the script's own Python between ops is about a
    # tenth of the forward even under PyTorch's profiler alone (bench/op_coverage.py prints both
    # figures side by side), so the check runs the example at a size where ops carry the step.
    # Another process on the machine only adds time between ops: a low reading is retried once.
    # On the CPU: there op times are host times, which this coverage is about (on CUDA they are
    # kernel times, and a model this small leaves the device idle between them).
    args = ("--hidden", "256", "--seq", "128", "--device", "cpu")
    coverage, report = _coverage(tmp_path, *args)
    if coverage < 0.9:
        coverage, report = _coverage(tmp_path, *args)
    assert 0.9 <= coverage <= 1.05, coverage
    ops = report["ops"]
    assert ops and all(op["intensity"] is not None and op["bytes"] > 0 for op in ops)
    assert all(op["bound"] in ("memory", "compute") for op in ops)
    assert any(op["name"].startswith("aten._scaled_dot_product") and op["flops"] > 0 for op in ops)
    assert report["run"]["device"]["peak_flops"]["fp32"] > 0
