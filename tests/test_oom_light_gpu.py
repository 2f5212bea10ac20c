"""A CUDA OOM in a light step, after the deep steps, under ``--enforce-budget`` (skipped without
a GPU). No storage tracker runs then: the probe knows parameters, gradients and optimizer state,
and the allocator's remaining bytes are inferred by phase (``oom.inferred_bytes``): in a forward
they are activations. Unit-tested on CPU (tests/test_memory_probe.py); this runs it in a job."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(200)]

# Four 4096-wide layers under Adam: ~1 GiB of model states; from step 7 the batch is 64 times
# larger, so the forward saves ~2 GiB more than fits a 1.75 GiB budget.
SCRIPT = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for step in range(10):
        x = torch.randn(256 * (64 if step >= 7 else 1), 4096, device="cuda")
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        print("step", step, float(loss), flush=True)
""")


def test_a_light_step_oom_infers_the_untracked_bytes_by_phase(tmp_path) -> None:
    script = tmp_path / "grows.py"
    script.write_text(SCRIPT)
    report = tmp_path / "oom.json"
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--steps", "10",
                          "--memory-budget", "1.75GiB", "--enforce-budget", "--json", str(report), str(script)],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 1, run.stderr[-2000:]
    record = json.loads(report.read_text())["memory"]["oom"]
    print({k: record.get(k) for k in ("step", "phase", "op", "module", "categories", "inferred_bytes",
                                      "allocated_bytes")})
    assert record["kind"] == "cuda" and record["step"] == 7 and record["phase"] == "forward", record
    state = 4 * (4096 * 4096 + 4096) * 4
    assert record["categories"]["parameter"] == state
    assert record["categories"]["optimizer_state"] >= 2 * state
    inferred = record["inferred_bytes"]
    assert set(inferred) == {"activation"} and inferred["activation"] > 256 * 64 * 4096 * 4, inferred
    assert sum(v for k, v in record["categories"].items() if k != "offloaded_host") == record["allocated_bytes"]
