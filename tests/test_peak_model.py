"""The simulated peak of a checkpointed chain equals the CPU storage tracker's peak of the run that
really checkpoints those blocks, from the timeline of one unremedied step (issue 14)."""

import functools
import gc
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from advisor.agent.agent import Agent
from advisor.apply.remedies.activation_offload import apply_activation_offload
from advisor.agent.hooks import install
from advisor.agent.probe_registry import build_probes
from advisor.recommend.peak_model import ChainMemory, BlockMemory, chain_memory, simulated_peak, solve
from advisor.records.samples import MemorySample, ModuleStat

ROOT = Path(__file__).resolve().parents[1]


def _gpt():
    spec = importlib.util.spec_from_file_location("peak_model_gpt", ROOT / "examples" / "gpt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _run(checkpointed: tuple[int, ...], layers: int = 4, offloaded: tuple[int, ...] = ()
         ) -> tuple[list[MemorySample], list[ModuleStat]]:
    """Three steps of examples/gpt.py's model under the memory probe; step 1 is deep-sampled."""
    gpt = _gpt()
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(layers=layers, hidden=64, seq=32, heads=4, vocab=256)
    model = gpt.GPT(cfg)
    for i in checkpointed:  # what the checkpointing applier does: non-reentrant, per block
        block = model.blocks[i]
        block.forward = functools.partial(checkpoint, block.__class__.forward.__get__(block), use_reentrant=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    handle = (apply_activation_offload(model, modules=[f"blocks.{i}" for i in offloaded], min_bytes=0)
              if offloaded else None)
    gen = torch.Generator().manual_seed(0)
    records: list = []
    config = {"probes": ["memory"], "deep_steps": [1]}
    probes, warnings = build_probes(config)
    assert not warnings
    agent = Agent(emit=records.append, config=config, probes=probes)
    for probe in probes:
        agent._call(probe, "attach")
    hooks = install(agent)
    try:
        for _ in range(3):
            # The checkpoint's graph can keep the previous step's tensors in a reference cycle until
            # the collector runs; collect so both runs start their step from the same live set.
            gc.collect()
            x, y = gpt.synthetic_batch(gen, cfg, 4)
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        agent.flush(sync=True)
    finally:
        hooks.remove()
        agent.close()
        if handle is not None:
            handle.revert()
    memory = [r for r in records if isinstance(r, MemorySample) and r.step == 1]
    modules = [r for r in records if isinstance(r, ModuleStat) and r.step == 1]
    return memory, modules


@pytest.fixture(scope="module")
def unremedied():
    memory, modules = _run(())
    names = [f"blocks.{i}" for i in range(4)]
    return chain_memory(memory, names, {m.name: m.input_bytes for m in modules})


@pytest.mark.parametrize("selected", [(0,), (3,), (1, 2), (0, 1, 2, 3)])
def test_simulated_peak_equals_the_tracked_peak_of_the_checkpointed_run(unremedied, selected):
    assert unremedied is not None
    memory, _ = _run(selected)
    measured = max(s.total_bytes for s in memory)
    assert simulated_peak(unremedied, selected) == measured


@pytest.mark.parametrize("checkpointed, offloaded", [((), (0,)), ((), (0, 1)), ((), (0, 1, 2)), ((1,), (0, 2)),
                                                     ((0, 2), (1,))])
def test_simulated_peak_with_offloaded_blocks_matches_the_tracked_peak(unremedied, checkpointed, offloaded):
    """An offloaded block frees all it saved until its backward, and brings back the block before
    it when that one is offloaded too; the device-category peak of the real run agrees within 2%
    (the model assumes the prefetched block arrives with the block's first backward op)."""
    memory, _ = _run(checkpointed, offloaded=offloaded)
    measured = max(s.total_bytes for s in memory)
    predicted = simulated_peak(unremedied, checkpointed, offloaded)
    assert predicted == pytest.approx(measured, rel=0.02)
    assert predicted < simulated_peak(unremedied, checkpointed)  # offloading lowered it


def test_nothing_selected_is_the_measured_peak(unremedied):
    assert simulated_peak(unremedied, ()) == unremedied.measured_peak_bytes
    # every block's checkpoint frees something, and more blocks free more
    peaks = [simulated_peak(unremedied, range(k)) for k in range(5)]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[-1]


def _chain(savings, forward_max, backward_max, recompute_peak, between, outside=0):
    blocks = tuple(
        BlockMemory(name=f"b{i}", saving_bytes=s, forward_max=f, forward_max_own=f - s // 2,
                    backward_max=b, recompute_peak=r)
        for i, (s, f, b, r) in enumerate(zip(savings, forward_max, backward_max, recompute_peak)))
    return ChainMemory(step=1, blocks=blocks, outside_bytes=outside, between_bytes=between,
                       measured_peak_bytes=max([between, outside, *forward_max, *backward_max]))


def test_solver_matches_brute_force_on_random_chains():
    import itertools
    import random

    rng = random.Random(7)  # private generator
    for _ in range(200):
        n = rng.randint(1, 7)
        savings = [rng.randint(1, 50) for _ in range(n)]
        fmax = sorted(rng.randint(50, 300) for _ in range(n))
        bmax = [f - rng.randint(0, 20) for f in fmax]
        rec = [b + rng.randint(-10, 30) for b in bmax]
        chain = _chain(savings, fmax, bmax, rec, between=fmax[-1] + rng.randint(0, 40), outside=rng.randint(0, 60))
        times = [rng.uniform(0.1, 2.0) for _ in range(n)]
        budget = rng.randint(60, chain.measured_peak_bytes)
        best = None
        for mask in itertools.product((False, True), repeat=n):
            chosen = tuple(i for i, on in enumerate(mask) if on)
            if simulated_peak(chain, chosen) <= budget:
                cost = sum(times[i] for i in chosen)
                if best is None or cost < best - 1e-12:
                    best = cost
        got = solve(chain, times, budget)
        if best is None:
            assert got is None
        else:
            assert got is not None and got.peak_bytes <= budget
            assert got.recompute_s == pytest.approx(best)


def test_a_chain_that_ran_twice_is_not_summarised():
    samples = [MemorySample(step=1, time=0.0, event="forward_start", total_bytes=10),
               MemorySample(step=1, time=0.1, event="aten.mm", module="blocks.0", total_bytes=20),
               MemorySample(step=1, time=0.2, event="forward_start", total_bytes=10),
               MemorySample(step=1, time=0.3, event="aten.mm", module="blocks.0", total_bytes=20)]
    assert chain_memory(samples, ["blocks.0"], {}) is None
