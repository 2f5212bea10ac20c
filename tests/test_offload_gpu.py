"""Offload on CUDA: the measured peak drop and step-time change against the joint model's
prediction, and gradients bit-identical to the unmodified run (skipped without a GPU).

The peak drop is predicted as ``advisor attach`` predicts it: ``peak_model``'s replay of a deep
step's measured timeline (``bench/offload.py``'s ``record_timeline``). The chain formula alone is
conservative: it keeps one offloaded block back on the device at the peak, where on the GPT the
peak comes before any offloaded block's backward (the H100 run of 2026-11-23 read a 1537 MiB drop
against the formula's 1075 MB)."""

from __future__ import annotations

import copy
import gc
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from advisor.apply.remedies.activation_offload import apply_activation_offload
from advisor.apply.remedies.optimizer_offload import apply_optimizer_offload
from advisor.apply.target import Target
from advisor.probes.device.hostlink import host_link
from advisor.recommend.memory_model import Block, Chain
from advisor.recommend.peak_model import choices_peak
from advisor.recommend.remedies.offload import KEEP, OFFLOAD, Model, evaluate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, GPTConfig  # noqa: E402


def _bench(name: str):
    """A bench/ script as a module, by path: bench/ on sys.path would shadow test imports."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


record_timeline = _bench("offload").record_timeline

pytestmark = pytest.mark.gpu
# Deterministic kernels for the gradient comparison (embedding backward uses atomics otherwise);
# cuBLAS asks for this workspace setting under torch.use_deterministic_algorithms.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
CFG = GPTConfig(vocab=8192, seq=1024, layers=8, hidden=1024, heads=16)
BATCH = 8
OFFLOADED = ["blocks.1", "blocks.3", "blocks.5"]  # not adjacent: one block back at a time in backward


def _setup():
    torch.manual_seed(0)
    model = GPT(CFG).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, CFG.vocab, (BATCH, CFG.seq), generator=g).cuda()
    y = torch.randint(0, CFG.vocab, (BATCH, CFG.seq), generator=g).cuda()
    return model, opt, x, y


def _step(model, opt, x, y) -> float:
    """One training step; returns its seconds (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loss = F.cross_entropy(model(x).view(-1, CFG.vocab), y.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _peak_of_one_step(model, opt, x, y) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    _step(model, opt, x, y)
    return torch.cuda.max_memory_allocated()


def _chain(model, x) -> Chain:
    """Per-block saved bytes (a pack hook per block) and forward seconds (CUDA events)."""
    blocks = []
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    h = model.tok_emb(x) + model.pos_emb(torch.arange(CFG.seq, device=x.device))
    for i, block in enumerate(model.blocks):
        seen: dict[int, int] = {}

        def pack(t):
            key = t.untyped_storage()._cdata
            if key not in params:
                seen[key] = t.untyped_storage().nbytes()
            return t.detach()  # the tensor itself would tie an output to its own node: the graph leaks

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = block(h)
        end.record()
        end.synchronize()
        blocks.append(Block(name=f"blocks.{i}", activation_bytes=sum(seen.values()),
                            input_bytes=h.numel() * h.element_size(), output_bytes=out.numel() * out.element_size(),
                            forward_s=start.elapsed_time(end) / 1e3))
        h = out
    return Chain(blocks=tuple(blocks))


def test_activation_offload_peak_and_time_match_the_prediction_and_gradients_are_equal() -> None:
    model, opt, x, y = _setup()
    for _ in range(3):
        base_time = _step(model, opt, x, y)  # warm up; the last is the baseline
    base_time = min(_step(model, opt, x, y) for _ in range(3))
    chain = _chain(model, x)
    gc.collect()
    memory = record_timeline(model, opt, x, y, CFG.vocab, [b.name for b in chain.blocks])
    gc.collect()
    model_ = Model(bandwidth=host_link("cuda")["host_link_bandwidth"])
    choices = [OFFLOAD if b.name in OFFLOADED else KEEP for b in chain.blocks]
    _, added = evaluate(chain, model_, choices, False)
    predicted_drop = choices_peak(memory, [KEEP] * chain.n) - choices_peak(memory, choices)
    base_peak = _peak_of_one_step(model, opt, x, y)  # after the recording, as the offloaded peak is

    handle = apply_activation_offload(Target.of(model, [opt]), modules=OFFLOADED, min_bytes=0)
    _step(model, opt, x, y)
    drop = base_peak - _peak_of_one_step(model, opt, x, y)
    off_time = min(_step(model, opt, x, y) for _ in range(3))
    assert abs(drop - predicted_drop) <= 0.10 * predicted_drop, (drop, predicted_drop)
    assert abs(off_time - (base_time + added)) <= 0.15 * base_time, (off_time, base_time, added)

    # Gradients of one step, offloaded and not, from the same parameters: bit-identical.
    def grads() -> list[torch.Tensor]:
        opt.zero_grad()
        F.cross_entropy(model(x).view(-1, CFG.vocab), y.view(-1)).backward()
        return [p.grad.clone() for p in model.parameters()]

    torch.use_deterministic_algorithms(True)
    try:
        with_offload = grads()
        handle.revert()
        assert all(torch.equal(a, b) for a, b in zip(with_offload, grads()))
    finally:
        torch.use_deterministic_algorithms(False)


def test_optimizer_offload_peak_drop_and_exact_step() -> None:
    model, opt, x, y = _setup()
    for _ in range(2):
        _step(model, opt, x, y)
    state = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if v.dim() > 0)
    gc.collect()  # the previous test's model and optimizer, not this apply, must not be what frees memory
    torch.cuda.synchronize()
    between = torch.cuda.memory_allocated()
    handle = apply_optimizer_offload(Target.of(model, [opt]))
    torch.cuda.synchronize()
    assert abs((between - torch.cuda.memory_allocated()) - state) <= 0.10 * state
    ref_model, ref_opt, _, _ = _setup()
    ref_model.load_state_dict(model.state_dict())
    # A deep copy: load_state_dict keeps CPU step counters (and tensors already on the target
    # device) as the same objects, so the two optimizers would advance one shared counter.
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    # The same gradients for both: CUDA's embedding backward accumulates with atomics, so two
    # backward passes differ in the last bits; the step, which is what offload touches, must not.
    opt.zero_grad()
    F.cross_entropy(model(x).view(-1, CFG.vocab), y.view(-1)).backward()
    for p, ref in zip(model.parameters(), ref_model.parameters()):
        ref.grad = p.grad.clone()
    opt.step()
    ref_opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))
    handle.revert()
    assert all(v.is_cuda for st in opt.state.values() for v in st.values() if v.dim() > 0)


def test_optimizer_offload_steps_in_chunks_with_a_fraction_of_the_state_on_the_device() -> None:
    """The chunked step: while one chunk steps the next comes up on the side stream, so during
    ``step()`` the device holds a few chunks of state, not all of it; the update stays exact."""
    import advisor.apply.remedies.optimizer_offload as mod

    model, opt, x, y = _setup()
    for _ in range(2):
        _step(model, opt, x, y)
    state = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if v.dim() > 0)
    ref_model, ref_opt, _, _ = _setup()
    ref_model.load_state_dict(model.state_dict())
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # no shared step counters (see above)
    handle = apply_optimizer_offload(Target.of(model, [opt]))
    loss = F.cross_entropy(model(x).view(-1, CFG.vocab), y.view(-1))
    opt.zero_grad()
    loss.backward()
    for p, ref in zip(model.parameters(), ref_model.parameters()):
        ref.grad = p.grad.clone()  # the same gradients: two CUDA backward passes differ (atomics)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    opt.step()
    torch.cuda.synchronize()
    during = torch.cuda.max_memory_allocated() - before
    assert handle.placements[0].chunks_run >= state // mod.CHUNK_BYTES
    assert during < 0.5 * state, (during, state)  # about three chunks, not the whole state
    ref_opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))
    handle.revert()
