"""``torch.compile`` of the GPT example's blocks (and, on the same run, its foreach AdamW switched
to fused kernels), applied live at step 5 by the executor, in process on CPU.

Through the executor (the training-process half of ``advisor attach --apply``) rather than a
subprocess: the host-overhead rule fires only where the CPU's ops cover a small share of the step,
which a loaded or an idle 2-core machine decides differently, so the command is given here as the
controller would send it. Losses stay within fp tolerance (fusion reorders floating-point work:
``live-equivalent``), the result is verified, and ``revert()`` restores the eager forward."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from fakes import FakeContext
from recommendations import wire

from advisor.apply.executor import Executor
from advisor.apply.remedies.compile_blocks import apply_compile_blocks
from advisor.apply.target import Target
from advisor.records.samples import StepSample

ROOT = Path(__file__).resolve().parents[1]
STEPS, AT = 10, 5
TOLERANCE = 1e-4  # relative, per loss: reassociation only


def gpt_module():
    spec = importlib.util.spec_from_file_location("example_gpt", ROOT / "examples" / "gpt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["example_gpt"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def make(gpt):
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(vocab=64, seq=16, layers=2, hidden=32, heads=2)
    model = gpt.GPT(cfg)
    return cfg, model, torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)


def train(gpt, cfg, model, opt, *, ex=None, ctx=None, commands=None) -> list[float]:
    gen = torch.Generator().manual_seed(1)
    losses = []
    for i in range(STEPS):
        if ex is not None:
            ctx.step = i
            if i in (commands or {}):
                ex.submit(commands[i])
            ex.on_boundary(i)
        x, y = gpt.synthetic_batch(gen, cfg, 2)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if ex is not None:
            ex.on_step_end(StepSample(index=i, time_s=0.1, deep=False))
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("rec", [
    wire("compile-blocks", "compile_blocks", params={"modules": ["blocks.0", "blocks.1"]}, apply_class="live-equivalent"),
    wire("fused-optimizer", "fused_optimizer", params={"optimizers": None}, apply_class="live-equivalent"),
], ids=["compile", "fused"])
def test_applied_live_at_step_5_on_the_gpt_example(rec) -> None:
    gpt = gpt_module()
    bare = train(gpt, *make(gpt))
    cfg, model, opt = make(gpt)
    ctx = FakeContext([model], [opt])
    ex = Executor(ctx)
    losses = train(gpt, cfg, model, opt, ex=ex, ctx=ctx, commands={
        0: {"type": "apply", "recommendation": rec, "at_step": AT, "measure_steps": 1}})
    [result] = ex.results
    assert result.status == "kept" and result.at_step == AT
    assert losses[:AT] == bare[:AT]
    assert losses == pytest.approx(bare, rel=TOLERANCE)
    if rec["remedy"] == "compile_blocks":
        assert all(b._compiled_call_impl is not None for b in model.blocks)


@pytest.mark.slow
def test_revert_restores_the_eager_forward() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    eager = model(x)
    handle = apply_compile_blocks(Target.of(model), modules=["0"])
    assert model[0]._compiled_call_impl is not None and model[1]._compiled_call_impl is None
    assert torch.allclose(model(x), eager)
    with pytest.raises(ValueError, match="no module named"):
        apply_compile_blocks(Target.of(model), modules=["nope"])
    with pytest.raises(ValueError, match="compiled already"):
        apply_compile_blocks(Target.of(model), modules=["0"])
    handle.revert()
    assert model[0]._compiled_call_impl is None
    assert torch.equal(model(x), eager)
