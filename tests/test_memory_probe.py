"""The memory probe driven by hand through FakeContext, checked against analytic counts."""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from fakes import FakeContext

from advisor.sections.memory import build_memory_section
from advisor.state import SessionState
from advisor.probes.memory import MemoryProbe
from advisor.probes.memory import probe as memory_probe
from advisor.records.samples import MEMORY_CATEGORIES, Event, ModuleStat
from advisor.records.settings import AgentSettings


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 32, dim: int = 16, heads: int = 2, layers: int = 2, seq: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class SaveKnown(torch.autograd.Function):
    """Saves its input and a 7x3 float32 tensor (84 bytes) made in forward."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        extra = torch.ones(7, 3)
        ctx.save_for_backward(x, extra)
        return x * 2

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, extra = ctx.saved_tensors
        return grad * 2 + 0 * x + 0 * extra.sum()


class Known(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return SaveKnown.apply(x)


def run_step(probe: MemoryProbe, ctx: FakeContext, model, opt, batch, loss_fn, *, deep: bool) -> None:
    """One training step with the phase calls the agent would make."""
    step = ctx.step
    ctx.step_start = time.perf_counter()
    if deep:
        probe.start_deep(ctx, step)
    for phase in ("data", "forward", "backward", "optimizer", "other"):
        ctx.phase = phase
        probe.on_phase(ctx, phase, time.perf_counter())
        if phase == "data":
            inputs, targets = batch()
        elif phase == "forward":
            loss = loss_fn(model(inputs), targets)
        elif phase == "backward":
            loss.backward()
        elif phase == "optimizer":
            opt.step()
            opt.zero_grad()
    if deep:
        probe.stop_deep(ctx, step)
    probe.on_step_end(ctx, step)
    ctx.step += 1


def train(model, batch, loss_fn, *, steps: int, deep: set[int], scan_gc: bool = True):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ctx = FakeContext([model], [opt])
    probe = MemoryProbe(scan_gc=scan_gc)
    probe.attach(ctx)
    try:
        for _ in range(steps):
            run_step(probe, ctx, model, opt, batch, loss_fn, deep=ctx.step in deep)
    finally:
        probe.detach(ctx)
    return ctx, probe, opt


def section_of(ctx: FakeContext) -> dict:
    state = SessionState()
    state.memory = ctx.of_kind("memory")  # type: ignore[assignment]
    state.modules = ctx.of_kind("module")  # type: ignore[assignment]
    state.events = ctx.of_kind("event")  # type: ignore[assignment]
    return build_memory_section(state, budget_bytes=None)


def mlp_batch():
    return torch.randn(32, 20), torch.randn(32, 5)


def gpt_batch():
    idx = torch.randint(0, 32, (4, 8))
    return idx, torch.randint(0, 32, (4, 8))


def gpt_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_model_state_categories_are_exact(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
        ctx, _, _ = train(model, mlp_batch, F.mse_loss, steps=3, deep={0, 2})
    else:
        model = TinyGPT()
        ctx, _, _ = train(model, gpt_batch, gpt_loss, steps=3, deep={0, 2})
    params = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    section = section_of(ctx)
    cmax = section["categories_max"]
    assert cmax["parameter"] == 4 * params
    assert cmax["gradient"] == 4 * params
    assert cmax["optimizer_state"] == 8 * params + 4 * tensors  # exp_avg, exp_avg_sq, step
    assert cmax["activation"] > 0 and cmax["input"] > 0
    at_peak = section["categories_at_peak"]
    assert set(at_peak) == set(MEMORY_CATEGORIES)
    assert sum(at_peak.values()) == section["peak_bytes"]
    # Deep steps sample at op granularity: many more samples than phase boundaries.
    deep_samples = [s for s in ctx.of_kind("memory") if s.step == 2]
    assert len(deep_samples) > 20
    assert all(sum(s.categories.values()) == s.total_bytes for s in ctx.of_kind("memory"))


def test_light_step_samples_once_with_model_state_only():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    ctx, _, _ = train(model, mlp_batch, F.mse_loss, steps=3, deep={0})
    light = [s for s in ctx.of_kind("memory") if s.step == 1]
    params = sum(p.numel() for p in model.parameters())
    assert [s.event for s in light] == ["optimizer_start"]
    assert light[0].categories["parameter"] == 4 * params
    assert light[0].categories["gradient"] == 4 * params
    assert not ctx.of_kind("module") or all(m.step == 0 for m in ctx.of_kind("module"))


def test_per_module_activation_bytes_match_what_each_module_saves():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Known(), nn.Linear(16, 4))

    def batch():
        return torch.randn(5, 8), torch.randn(5, 4)

    ctx, _, _ = train(model, batch, F.mse_loss, steps=2, deep={1})
    stats = {m.name: m for m in ctx.of_kind("module") if isinstance(m, ModuleStat)}
    f32 = 4
    assert stats["0"].activation_bytes == 5 * 8 * f32  # Linear saves its input (not its weight)
    assert stats["1"].activation_bytes == 5 * 16 * f32  # ReLU saves its output
    assert stats["2"].activation_bytes == 5 * 16 * f32 + 7 * 3 * f32  # input + the 7x3 tensor
    assert stats["3"].activation_bytes == 5 * 16 * f32  # Linear saves its input
    assert stats["0"].input_bytes == 5 * 8 * f32 and stats["0"].output_bytes == 5 * 16 * f32
    assert stats["3"].parameter_bytes == (16 * 4 + 4) * f32
    assert stats[""].parameter_bytes == sum(p.numel() for p in model.parameters()) * f32
    assert all(m.forward_s > 0 for m in stats.values())
    assert stats["3"].backward_s > 0 and stats[""].backward_s >= stats["3"].backward_s
    inclusive = [e for e in ctx.of_kind("event") if e.name == "module_activations"][0]
    # The ReLU output is saved by ReLU, Known and the last Linear: counted once for the model.
    assert inclusive.data["inclusive_bytes"][""] == (5 * 8 + 5 * 16 + 7 * 3 + 5 * 16) * f32


def test_tracking_does_not_change_gradients():
    def grads(deep: set[int]):
        torch.manual_seed(1)
        model = TinyGPT()
        train(model, gpt_batch, gpt_loss, steps=2, deep=deep)
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(grads(set()), grads({0, 1})):
        assert torch.equal(a, b)


def test_enforced_budget_raises_out_of_memory_with_a_flight_record():
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))

    def batch():
        return torch.randn(1024, 64), torch.randn(1024, 10)

    # Tensors that earlier tests left alive (caches, fixtures) are not counted: with them, half the
    # peak could lie below what was alive before the step, and the first op of the batch (no module)
    # would exceed it.
    ctx, _, _ = train(make(), batch, F.mse_loss, steps=2, deep={1}, scan_gc=False)
    peak = section_of(ctx)["peak_bytes"]
    settings = AgentSettings(memory_budget_bytes=peak // 2, enforce_budget=True)
    model = make()
    opt = torch.optim.Adam(model.parameters())
    ctx = FakeContext([model], [opt], settings=settings)
    probe = MemoryProbe(scan_gc=False)
    probe.attach(ctx)
    try:
        with pytest.raises(torch.OutOfMemoryError) as info:
            run_step(probe, ctx, model, opt, batch, F.mse_loss, deep=False)
        probe.on_exception(ctx, info.value)  # what the agent does next: no second record
    finally:
        probe.detach(ctx)
    ooms = [e for e in ctx.of_kind("event") if isinstance(e, Event) and e.name == "oom"]
    assert len(ooms) == 1
    data = ooms[0].data
    assert data["op"].startswith("aten.")
    assert data["module"] in {"0", "1", "2"}
    assert data["requested_bytes"] > 0
    assert data["tracked_bytes"] + data["requested_bytes"] > peak // 2
    assert sum(data["categories"].values()) == data["tracked_bytes"]
    assert data["categories"]["parameter"] == 4 * sum(p.numel() for p in model.parameters())
    assert any(f["file"].endswith("test_memory_probe.py") for f in data["frames"])
    state = SessionState(events=ctx.of_kind("event"))  # type: ignore[arg-type]
    assert build_memory_section(state, budget_bytes=peak // 2)["oom"]["op"] == data["op"]
    # The mode is gone after detach: ops are no longer tracked.
    assert torch.ones(3).sum().item() == 3


def test_real_oom_from_cuda_message_is_recorded_on_exception():
    model = nn.Linear(4, 4)
    ctx = FakeContext([model], [])
    probe = MemoryProbe()
    probe.attach(ctx)

    def forward_that_fails():
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        except torch.OutOfMemoryError as exc:
            return exc

    exc = forward_that_fails()
    probe.on_exception(ctx, exc)
    probe.on_exception(ctx, ValueError("not memory"))
    probe.detach(ctx)
    (oom,) = [e for e in ctx.of_kind("event") if e.name == "oom"]
    assert oom.data["requested_bytes"] == 2 * 2**30
    assert oom.data["frames"][-1]["function"] == "forward_that_fails"
    assert sum(oom.data["categories"].values()) >= 4 * 20


def test_a_cpu_job_on_a_gpu_host_is_measured_and_budgeted_on_the_cpu(monkeypatch):
    """The probe follows the device the job's parameters are on, not what the host has: on an
    H100 host a CPU job once got the CUDA view (an empty allocator, light samples at every
    phase, a budget that bounded nothing). Here the host claims CUDA; CUDA's recorders are stubbed."""
    started = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(memory_probe, "start_memory_history", lambda n: started.append("history"))
    monkeypatch.setattr(memory_probe, "apply_cuda_budget", lambda b: started.append("budget"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    ctx, probe, _ = train(model, mlp_batch, F.mse_loss, steps=3, deep={0})
    assert started == ["history"] and not probe.cuda
    assert [s.event for s in ctx.of_kind("memory") if s.step == 1] == ["optimizer_start"]

    big = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.Adam(big.parameters())
    ctx = FakeContext([big], [opt], settings=AgentSettings(memory_budget_bytes=1 << 16, enforce_budget=True))
    probe = MemoryProbe()
    probe.attach(ctx)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            run_step(probe, ctx, big, opt, lambda: (torch.randn(1024, 64), torch.randn(1024, 10)), F.mse_loss,
                     deep=False)
    finally:
        probe.detach(ctx)
    assert started[-1] == "budget"


class _CountingList(list):
    """A list that counts the walks over it (``iter``)."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


def test_light_steps_do_not_walk_every_parameter_for_the_gradient_bytes():
    """Issue 14: nothing per light step scales with the number of parameters. One gradient
    stands for all of them; a change of its storage's size (a remedy resharding them) makes the
    probe walk again, and zero_grad(set_to_none) reads as no gradient bytes."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(6)), nn.Linear(16, 5))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ctx = FakeContext([model], [opt])
    probe = MemoryProbe()
    probe.attach(ctx)
    params = sum(p.numel() for p in model.parameters())
    try:
        run_step(probe, ctx, model, opt, lambda: (torch.randn(8, 16), torch.randn(8, 5)), F.mse_loss, deep=False)
        probe._params = _CountingList(probe._params)
        _CountingList.walks = 0
        for _ in range(5):
            run_step(probe, ctx, model, opt, lambda: (torch.randn(8, 16), torch.randn(8, 5)), F.mse_loss, deep=False)
        assert _CountingList.walks == 0
        samples = [s for s in ctx.of_kind("memory") if s.event == "optimizer_start"]
        assert [s.categories["gradient"] for s in samples] == [4 * params] * 6
        cats = probe._light_categories(ctx)  # after opt.zero_grad(): set to None
        assert cats["gradient"] == 0 and _CountingList.walks == 0
        for p in model.parameters():  # each gradient now a view into a storage twice its size
            p.grad = torch.zeros(2 * p.numel())[: p.numel()].view_as(p)
        assert probe._light_categories(ctx)["gradient"] == 8 * params
        assert _CountingList.walks == 1
    finally:
        probe.detach(ctx)


def test_a_light_cuda_oom_gives_the_allocators_unexplained_bytes_to_the_phase_s_category():
    """A CUDA OOM on a light step knows parameters, gradients and optimizer state only; the
    allocator's other bytes were missing from the record, and the plan made from it offloaded
    the optimizer state of a forward that had none (an H200, 2026-11-26)."""
    known = {"parameter": 400, "gradient": 0, "optimizer_state": 0, "activation": 0, "offloaded_host": 900}
    forward = dict(known)
    assert memory_probe.infer_untracked(forward, 3000, "forward") == {"activation": 2600}
    assert forward["activation"] == 2600 and forward["offloaded_host"] == 900  # host copies are not device bytes
    step = dict(known)
    assert memory_probe.infer_untracked(step, 1000, "optimizer") == {"temporary": 600}
    assert memory_probe.infer_untracked(dict(known), 300, "forward") == {}  # nothing unexplained
    assert memory_probe.infer_untracked(dict(known), None, "data") == {}


@pytest.mark.gpu
def test_allocator_counters_read_what_the_flattening_calls_read() -> None:
    """One nested read of the allocator's statistics gives what ``memory_allocated``,
    ``memory_reserved`` and ``max_memory_allocated`` give (each flattens the whole dict: 0.4 ms a
    call on an H200's host, ten a step on the light path)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from advisor.probes.memory.cuda import allocator_counters

    keep = [torch.empty(n, device="cuda") for n in (1 << 20, 3 << 18, 12345)]
    del keep[1]
    counters = allocator_counters(torch.cuda.current_device())
    assert counters["allocated_bytes"] == torch.cuda.memory_allocated() > 0
    assert counters["reserved_bytes"] == torch.cuda.memory_reserved() >= counters["allocated_bytes"]
    assert counters["peak_allocated_bytes"] == torch.cuda.max_memory_allocated()
    assert counters["alloc_retries"] == torch.cuda.memory_stats().get("num_alloc_retries", 0)
