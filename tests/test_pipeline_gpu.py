"""The in-process pipeline across two or more GPUs: losses kept, placement moved and restored, and the
planner's per-stage peak and step time against the measured ones (within 15%)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from advisor.apply.remedies.pipeline import PipelineHandle, apply_pipeline
from advisor.recommend.remedies.pipeline_planner import PipeBlock, evaluate
from pipeline_models import Target, load_gpt, train_gpt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 or more GPUs"),
]


def test_two_gpu_split_keeps_losses_and_moves_back_on_revert() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    base = train_gpt(20, device="cuda:0")
    handles: list[PipelineHandle] = []

    def at(step: int, target: Target) -> None:
        model, opt = target.models()[0], target.optimizers()[0]
        if step == 5:
            handles.append(apply_pipeline(target, stages=[["blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]],
                                          micro_batches=4, devices=["cuda:0", "cuda:1"]))
            p = next(model.blocks[3].parameters())
            assert p.device == torch.device("cuda", 1)
            assert all(v.device == p.device for v in opt.state[p].values() if v.dim() > 0)
            assert any(q is p for g in opt.param_groups for q in g["params"])  # same Parameter object
        if step == 15:
            handles[0].revert()
            assert {q.device for q in model.parameters()} == {torch.device("cuda", 0)}

    losses = train_gpt(20, at, device="cuda:0")
    for a, b in zip(base, losses):
        assert abs(a - b) <= 1e-5 * abs(a)
    assert handles[0].pipelined_forwards == 9


def _step(model: Any, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, vocab: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = F.cross_entropy(model(x).view(-1, vocab), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def test_measured_stage_peak_and_step_time_match_the_planner_within_15_percent() -> None:
    gpt = load_gpt()
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(vocab=512, seq=512, layers=8, hidden=1024, heads=16)
    batch, m, p = 16, 8, 2
    model = gpt.GPT(cfg).to("cuda:0")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    x, y = (t.to("cuda:0") for t in gpt.synthetic_batch(gen, cfg, batch))
    for _ in range(3):
        _step(model, opt, x, y, cfg.vocab)
    baseline = statistics.median(_step(model, opt, x, y, cfg.vocab) for _ in range(5))

    # One block measured on its own: forward and backward time, activations kept for backward.
    block = model.blocks[0]
    h = torch.randn(batch, cfg.seq, cfg.hidden, device="cuda:0", requires_grad=True)
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(0)
        t0 = time.perf_counter()
        out = block(h)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        kept = torch.cuda.memory_allocated(0) - before - out.numel() * out.element_size()
        out.backward(torch.ones_like(out))
        torch.cuda.synchronize()
        times.append((t1 - t0, time.perf_counter() - t1, kept))
    fwd, bwd, act = (statistics.median(v[i] for v in times) for i in range(3))
    params = sum(q.numel() * q.element_size() for q in block.parameters())
    blocks = [PipeBlock(name=f"blocks.{i}", forward_s=fwd, backward_s=bwd, activation_bytes=int(act),
                        parameter_bytes=params, optimizer_bytes=2 * params,
                        output_bytes=batch * cfg.seq * cfg.hidden * 4) for i in range(cfg.layers)]
    chain_s = cfg.layers * (fwd + bwd)
    bounds = (0, 4, 8)
    predicted = evaluate(blocks, bounds, micro_batches=m, schedule="gpipe", bandwidth_bytes_s=25e9)

    handle = apply_pipeline(Target(model, opt), stages=[[f"blocks.{i}" for i in range(a, b)] for a, b in [(0, 4), (4, 8)]],
                            micro_batches=m, devices=["cuda:0", "cuda:1"])
    _step(model, opt, x, y, cfg.vocab)  # the verifying forward
    _step(model, opt, x, y, cfg.vocab)
    torch.cuda.reset_peak_memory_stats(1)
    measured = statistics.median(_step(model, opt, x, y, cfg.vocab) for _ in range(5))
    peak1 = torch.cuda.max_memory_allocated(1)
    handle.revert()
    assert handle.pipelined_forwards == 6
    # Stage 1 holds only its blocks: its peak is what the planner predicts for it.
    assert peak1 == pytest.approx(predicted.peak_bytes[1], rel=0.15)
    expected = baseline - chain_s + predicted.step_time_s
    assert measured == pytest.approx(expected, rel=0.15)
    assert p == len(predicted.stage_time_s)
