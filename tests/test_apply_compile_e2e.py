"""End to end: ``advisor attach --headless --apply compile-blocks`` on the CPU GPT example compiles
its repeated blocks live at step 5, keeps the losses within fp tolerance (fusion reorders
floating-point work: live-equivalent), and a unit check that ``revert()`` restores eager."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from advisor.apply.remedies.compile_blocks import apply_compile_blocks
from advisor.apply.target import Target

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
ARGS = ["--steps", "12", "--layers", "2", "--hidden", "64", "--seq", "32"]  # small: compiling is slow on CPU
TOLERANCE = 1e-4  # relative, per loss: reassociation only


def test_compile_blocks_applied_live_on_the_gpt_example(tmp_path) -> None:
    bare = subprocess.run([sys.executable, "examples/gpt.py", *ARGS], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=True).stdout
    bare_losses = [float(line.split()[3]) for line in bare.splitlines() if line.startswith("step ")]
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--apply", "compile-blocks",
                          "--apply-at-step", "5", "--steps", "12", "--json", str(out), "examples/gpt.py", *ARGS],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    [applied] = report["applied"]
    # step 5, or a boundary later when the advice came late on a loaded machine
    assert applied["remedy"] == "compile_blocks" and applied["at_step"] >= 5
    assert applied["params"] == {"modules": ["blocks.0", "blocks.1"]}
    assert applied["status"] in ("kept", "reverted"), applied  # verified either way; speed is load-dependent
    losses = [s["loss"] for s in report["steps"]]
    assert losses[:applied["at_step"]] == bare_losses[:applied["at_step"]]
    assert losses == pytest.approx(bare_losses, rel=TOLERANCE)


def test_revert_restores_the_eager_forward() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    eager = model(x)
    handle = apply_compile_blocks(Target.of(model), modules=["0"])
    assert model[0]._compiled_call_impl is not None and model[1]._compiled_call_impl is None
    with pytest.raises(ValueError, match="no module named"):
        apply_compile_blocks(Target.of(model), modules=["nope"])
    with pytest.raises(ValueError, match="compiled already"):
        apply_compile_blocks(Target.of(model), modules=["0"])
    handle.revert()
    assert model[0]._compiled_call_impl is None
    assert torch.equal(model(x), eager)
