"""ComputeProbe driven by hand: count on one deep step, time on the next."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from fakes import FakeContext

from advisor.sections.compute import build_compute_section, build_ops_section
from advisor.state import LiveState
from advisor.probes.compute import ComputeProbe
from advisor.records.samples import OpStat, StepSample


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 128, heads: int = 4, layers: int = 2, seq: int = 64) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _setup(device: str = "cpu"):
    torch.manual_seed(0)
    model = TinyGPT().to(device)
    opt = torch.optim.AdamW(model.parameters())
    ctx = FakeContext([model], [opt])
    ctx.device = torch.device(device)
    idx = torch.randint(0, 512, (8, 64), device=device)
    return model, opt, ctx, idx


def _train_step(model, opt, ctx, idx) -> float:
    """One step with the phases set as the agent would; returns forward+backward seconds."""
    ctx.phase = "forward"
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    ctx.phase = "backward"
    loss.backward()
    if idx.is_cuda:
        torch.cuda.synchronize()
    fwd_bwd = time.perf_counter() - t0
    ctx.phase = "optimizer"
    opt.step()
    opt.zero_grad()
    ctx.phase = "data"
    return fwd_bwd


def _deep_pair(model, opt, ctx, idx, probe, first: int) -> float:
    ctx.step = first
    probe.start_deep(ctx, first)
    _train_step(model, opt, ctx, idx)
    probe.stop_deep(ctx, first)
    assert ctx.deep_requests[-1] == 1  # the counted step asks for its timed step
    ctx.step = first + 1
    probe.start_deep(ctx, first + 1)
    fwd_bwd = _train_step(model, opt, ctx, idx)
    probe.stop_deep(ctx, first + 1)
    return fwd_bwd


@pytest.fixture(scope="module")
def gpt_run():
    model, opt, ctx, idx = _setup()
    _train_step(model, opt, ctx, idx)  # warm-up
    probe = ComputeProbe()
    fwd_bwd = _deep_pair(model, opt, ctx, idx, probe, first=1)
    return ctx, fwd_bwd


def test_ops_cover_the_timed_steps_forward_and_backward(gpt_run) -> None:
    ctx, fwd_bwd = gpt_run
    ops = [r for r in ctx.of_kind("op") if isinstance(r, OpStat)]
    assert ops and {r.step for r in ops} == {2}  # records carry the timed step

    def coverage(run_ctx, total: float) -> float:
        ops = [r for r in run_ctx.of_kind("op") if isinstance(r, OpStat)]
        return sum(r.time_s for r in ops if r.phase in ("forward", "backward")) / total

    assert coverage(ctx, fwd_bwd) <= 1.05
    # Coverage is measured on ops of a realistic size (batch 32): on the 20 ms toy step the
    # profiler's fixed per-op cost, which lands outside op time, is a tenth of the step.
    # Another process on the machine only ever adds time outside ops, so a low reading is
    # retried on fresh steps, twice at most.
    best = 0.0
    for _ in range(3):
        model, opt, ctx2, _ = _setup()
        idx = torch.randint(0, 512, (32, 64))
        _train_step(model, opt, ctx2, idx)
        best = max(best, coverage(ctx2, _deep_pair(model, opt, ctx2, idx, ComputeProbe(), first=1)))
        if best >= 0.9:
            break
    assert best >= 0.9


def test_ops_are_attributed_to_modules_and_phases(gpt_run) -> None:
    ctx, _ = gpt_run
    ops = ctx.of_kind("op")
    by = {(r.name, r.module, r.phase) for r in ops}
    assert ("aten.addmm", "blocks.0.qkv", "forward") in by
    assert ("aten.mm", "blocks.1.fc", "backward") in by  # weight/input grads of fc
    assert ("aten.native_layer_norm_backward", "blocks.0.ln2", "backward") in by
    assert ("aten._scaled_dot_product_flash_attention_for_cpu", "blocks.0", "forward") in by
    assert any(r.phase == "optimizer" for r in ops)
    attn = [r for r in ops if r.name == "aten._scaled_dot_product_flash_attention_for_cpu"]
    assert len(attn) == 2 and all(r.flops == 4 * 8 * 4 * 64 * 64 * 32 and r.count == 1 for r in attn)
    qkv = next(r for r in ops if r.module == "blocks.0.qkv" and r.name == "aten.addmm")
    assert qkv.flops == 2 * 512 * 128 * 384 + 512 * 384 and qkv.time_s > 0


def test_report_items_have_intensity_and_verdicts(gpt_run) -> None:
    ctx, _ = gpt_run
    live = LiveState()
    for r in ctx.emitted:
        live.add(r)
    live.add(StepSample(index=2, time_s=1.0, deep=True))
    spec = {"peak_flops": {"fp32": 1e11}, "memory_bandwidth": 2e10}
    items = build_ops_section(live.snapshot(), spec)
    assert items and all(i["intensity"] is not None for i in items)  # zero-byte ops are left out
    assert [i["time_s"] for i in items] == sorted((i["time_s"] for i in items), reverse=True)
    assert {i["bound"] for i in items} == {"memory", "compute"}
    compute = build_compute_section(live.snapshot(), spec)
    assert compute["per_module"][0]["time_s"] >= compute["per_module"][-1]["time_s"]
    assert compute["deep_steps"] == [2]


def test_counted_step_without_timed_step_is_emitted_at_detach() -> None:
    lin = nn.Linear(16, 8)
    ctx = FakeContext([lin])
    x = torch.randn(4, 16)
    probe = ComputeProbe()
    probe.start_deep(ctx, 5)
    ctx.phase = "forward"
    lin(x)
    probe.stop_deep(ctx, 5)
    assert ctx.of_kind("op") == []  # waiting for the timed step
    probe.detach(ctx)
    ops = ctx.of_kind("op")
    assert [r.name for r in ops if r.bytes] == ["aten.addmm"] and ops[0].step == 5


def test_a_step_of_more_ops_than_the_profiler_bound_is_timed_where_it_was_counted() -> None:
    """Issue 37: the profiler's step holds every op's event (1.6 GiB at 85 000 ops); beyond the
    bound the counted step's ops are emitted at once with their inline times, and a warning says so."""
    model, opt, ctx, idx = _setup()
    _train_step(model, opt, ctx, idx)
    requests = len(ctx.deep_requests)
    probe = ComputeProbe(max_profiled_ops=10)
    ctx.step = 1
    probe.start_deep(ctx, 1)
    _train_step(model, opt, ctx, idx)
    probe.stop_deep(ctx, 1)
    assert len(ctx.deep_requests) == requests  # no profiled step asked for
    ops = ctx.of_kind("op")
    assert ops and all(r.step == 1 for r in ops) and sum(r.time_s for r in ops) > 0
    [warning] = [e for e in ctx.of_kind("event") if e.name == "warning"]
    assert "timed inside the counting mode" in warning.data["message"] and warning.data["source"] == "compute"
    counted = len(ops)
    ctx.step = 2  # the next deep step of the run: not counted again (one count of so large a step)
    probe.start_deep(ctx, 2)
    _train_step(model, opt, ctx, idx)
    probe.stop_deep(ctx, 2)
    assert len(ctx.of_kind("op")) == counted
    unbounded = ComputeProbe()  # the default bound is far above a small GPT's op count
    ctx.step = 3
    unbounded.start_deep(ctx, 3)
    _train_step(model, opt, ctx, idx)
    unbounded.stop_deep(ctx, 3)
    assert ctx.deep_requests[-1] == 1


@pytest.mark.gpu
def test_cuda_op_time_is_kernel_time() -> None:
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, b)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        torch.mm(a, b)
    end.record()
    end.synchronize()
    kernel_s = start.elapsed_time(end) / 1e3 / 10
    ctx = FakeContext()
    ctx.device = torch.device("cuda")
    probe = ComputeProbe()
    for step in (1, 2):
        probe.start_deep(ctx, step)
        ctx.phase = "forward"
        for _ in range(5):  # back to back, like the reference: a lone kernel can run at idle clocks
            torch.mm(a, b)
        probe.stop_deep(ctx, step)
    (op,) = [r for r in ctx.of_kind("op") if r.name == "aten.mm"]
    assert op.dtype == "bfloat16" and op.count == 5 and op.flops == 5 * 2 * n**3
    assert 0.5 * kernel_s <= op.time_s / op.count <= 2.0 * kernel_s
