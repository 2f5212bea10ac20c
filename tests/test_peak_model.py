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
from advisor.recommend.peak_model import ChainMemory, BlockMemory, chain_memory, module_figures, simulated_peak, solve
from advisor.records.samples import MemorySample, ModuleStat
from advisor.records.settings import AgentSettings
from fakes import Emitted

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

    def train_step() -> None:
        x, y = gpt.synthetic_batch(gen, cfg, 4)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    try:
        return _deep_step_records(train_step)
    finally:
        if handle is not None:
            handle.revert()


def _deep_step_records(train_step) -> tuple[list[MemorySample], list[ModuleStat]]:
    """Three calls of ``train_step`` under the agent's memory probe; step 1's records (deep)."""
    records = Emitted()
    settings = AgentSettings(probes=("memory",), deep_steps=(1,))
    probes, warnings = build_probes(settings)
    assert not warnings
    agent = Agent(emit=records.append, settings=settings, probes=probes)
    agent.attach_probes()
    hooks = install(agent)
    try:
        for _ in range(3):
            # The checkpoint's graph can keep the previous step's tensors in a reference cycle until
            # the collector runs; collect so both runs start their step from the same live set.
            gc.collect()
            train_step()
        agent.flush(sync=True)
    finally:
        hooks.remove()
        agent.close()
    return ([r for r in records if isinstance(r, MemorySample) and r.step == 1],
            [r for r in records if isinstance(r, ModuleStat) and r.step == 1])


def _chain_of(memory: list[MemorySample], names: list[str], modules: list[ModuleStat]) -> ChainMemory | None:
    """The chain's summary as the recommender makes it (``memory_model.chain_timeline``)."""
    return chain_memory(memory, names, *module_figures(modules))


@pytest.fixture(scope="module")
def unremedied():
    memory, modules = _run(())
    names = [f"blocks.{i}" for i in range(4)]
    return _chain_of(memory, names, modules)


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


def _cnn_run(checkpointed: tuple[str, ...]) -> tuple[list[MemorySample], list[ModuleStat]]:
    """Three steps of examples/cnn.py's ResNet under the memory probe; step 1 is deep-sampled."""
    spec = importlib.util.spec_from_file_location("peak_model_cnn", ROOT / "examples" / "cnn.py")
    cnn = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = cnn
    spec.loader.exec_module(cnn)
    torch.manual_seed(0)
    model = cnn.ResNet()
    modules = dict(model.named_modules())
    for name in checkpointed:
        m = modules[name]
        m.forward = functools.partial(checkpoint, m.__class__.forward.__get__(m), use_reentrant=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(0)

    def train_step() -> None:
        x, y = torch.randn(32, 3, 32, 32, generator=gen), torch.randint(0, 10, (32,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return _deep_step_records(train_step)


@pytest.mark.parametrize("names, selections", [
    (["stages.0", "stages.1", "stages.2"], ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2))),
    ([f"stages.{s}.{b}" for s in range(3) for b in range(2)], ((0,), (2,), (4,), (5,), (0, 4), (1, 3, 5))),
])
def test_cnn_simulated_peak_equals_the_tracked_one(names, selections):
    """examples/cnn.py, a ResNet (in-place ReLUs, a gradient sum at each shortcut), chained by
    stages and by BasicBlocks: the simulated peak equals the tracked peak of every checkpointed
    run. Three per-storage facts make it exact, each of which read high or low before:
    - a block's in-place ReLU saves its output, which the next block saves again: checkpointing
      the block frees it only after the next block's backward (``checkpoint_freed_late_bytes``),
      so it counts at the block's recomputation and not while the block waits;
    - a stage's input, saved already by the stem's ReLU, is not the stage's to free (stages.0
      read +15%);
    - the recomputation starts from the total just before the block's first backward op, and
      grows as the forward did from just before its first op (``op_bytes``; a downsampling
      block read -1.7%)."""
    memory, modules = _cnn_run(())
    chain = _chain_of(memory, names, modules)
    assert chain is not None
    for selected in selections:
        checkpointed, _ = _cnn_run(tuple(names[i] for i in selected))
        measured = max(s.total_bytes for s in checkpointed)
        assert simulated_peak(chain, selected) == measured, selected


def test_checkpoint_freed_bytes_follow_each_saved_storage_to_its_last_saver():
    """Known saves: each block is Linear, Tanh (saves its output t), Linear (saves t), in-place
    ReLU (saves its output y, the block's output). t lives and dies inside the block: freed while
    the block waits. y is saved again by the next block's first Linear (or, for the last block,
    is what the loss reads): freed only late. The block's input, created before it, is neither."""
    torch.manual_seed(0)
    batch, width = 4, 16

    def block() -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(),
                                   torch.nn.Linear(width, width), torch.nn.ReLU(inplace=True))

    model = torch.nn.Sequential(block(), block(), block())
    x = torch.randn(batch, width)

    def train_step() -> None:
        model(x).sum().backward()

    _, modules = _deep_step_records(train_step)
    stats = {m.name: m for m in modules}
    one = batch * width * 4  # bytes of t, and of y
    for name in ("0", "1", "2"):
        assert (stats[name].checkpoint_freed_bytes, stats[name].checkpoint_freed_late_bytes) == (one, one), name
    # Inside a block: the Tanh's output is saved by the Linear after it, outside the Tanh.
    assert (stats["1.1"].checkpoint_freed_bytes, stats["1.1"].checkpoint_freed_late_bytes) == (0, one)
    # The whole model: every t and the first two y are its own; the last y is its output.
    assert (stats[""].checkpoint_freed_bytes, stats[""].checkpoint_freed_late_bytes) == (5 * one, one)
