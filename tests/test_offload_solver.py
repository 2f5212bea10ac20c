"""The joint keep/recompute/offload solver: exact against brute force on random chains."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from advisor.recommend.memory_model import Block, Chain
from advisor.recommend.peak_model import BlockMemory, ChainMemory, choices_peak
from advisor.recommend.remedies.offload import (
    KEEP, OFFLOAD, RECOMPUTE, Model, brute_force, evaluate, offload_cost, solve, tradeoff_curve,
)


def random_chain(rng: random.Random, n: int) -> Chain:
    blocks = []
    x = rng.randint(1, 8) * 100
    for i in range(n):
        y = rng.randint(1, 8) * 100
        blocks.append(Block(name=f"blocks.{i}", activation_bytes=rng.randint(5, 60) * 100, input_bytes=x,
                            output_bytes=y, forward_s=rng.uniform(1e-3, 2e-2)))
        x = y
    return Chain(blocks=tuple(blocks), fixed_bytes=rng.randint(0, 5000), other_activation_bytes=rng.randint(0, 2000))


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_on_random_chains(seed: int) -> None:
    rng = random.Random(seed)
    chain = random_chain(rng, rng.randint(1, 7))
    state = rng.choice([0, rng.randint(1000, 20000)])
    model = Model(bandwidth=rng.choice([1e5, 1e6, 1e7]), optimizer_state_bytes=state,
                  step_peak_bytes=rng.randint(0, state + 5000), overlap=rng.random() < 0.8)
    allowed = rng.choice([(KEEP, RECOMPUTE, OFFLOAD), (KEEP, RECOMPUTE), (KEEP, OFFLOAD)])
    low = brute_force(chain, model, 0, allowed=allowed).peak_bytes
    for frac in (0.0, 0.3, 0.6, 0.9, 1.0):
        budget = int(low + frac * (chain.baseline_peak_bytes - low))
        dp = solve(chain, model, budget, allowed=allowed)
        bf = brute_force(chain, model, budget, allowed=allowed)
        assert dp.feasible == bf.feasible, (budget, dp, bf)
        if bf.feasible:
            assert dp.overhead_s == pytest.approx(bf.overhead_s, abs=1e-12), (budget, dp, bf)
            assert dp.peak_bytes <= budget
        else:
            assert dp.peak_bytes == bf.peak_bytes
        assert evaluate(chain, model, dp.choices, dp.offload_optimizer) == (dp.peak_bytes, pytest.approx(dp.overhead_s))
        assert not set(dp.choices) - set(allowed) and (not chain.n or dp.choices[-1] != OFFLOAD)


def test_offload_wins_when_it_hides_and_recompute_when_the_link_is_slow() -> None:
    blocks = tuple(Block(name=f"blocks.{i}", activation_bytes=1000, input_bytes=100, output_bytes=100,
                         forward_s=0.01) for i in range(4))
    chain = Chain(blocks=blocks, fixed_bytes=1000)
    budget = chain.baseline_peak_bytes - 900  # offloading two blocks: 2000 out, 1000 back in backward
    fast = solve(chain, Model(bandwidth=1e6), budget)  # 1 ms copies behind 10 ms forwards: free
    assert OFFLOAD in fast.choices and RECOMPUTE not in fast.choices
    # Every copy hides except the first fetch of the run's last block (nothing before it to hide behind).
    assert fast.overhead_s == pytest.approx(0.001)
    slow = Model(bandwidth=1e4)  # 100 ms copies: recompute (10 ms) wins
    plan = solve(chain, slow, budget)
    assert OFFLOAD not in plan.choices and RECOMPUTE in plan.choices
    assert offload_cost(chain, slow, 0, True) == pytest.approx((0.1 - 0.01) + (0.1 - 0.02))
    assert offload_cost(chain, slow, 0, False) == pytest.approx((0.1 - 0.01) + 0.1)  # fetched on first use
    inline = Model(bandwidth=1e4, overlap=False)  # a CPU-only device: copies hide behind nothing
    assert offload_cost(chain, inline, 0, True) == pytest.approx(0.2)


def test_optimizer_offload_is_chosen_when_model_states_dominate() -> None:
    blocks = tuple(Block(name=f"blocks.{i}", activation_bytes=100, input_bytes=10, output_bytes=10,
                         forward_s=0.01) for i in range(3))
    chain = Chain(blocks=blocks, fixed_bytes=10000)
    model = Model(bandwidth=1e6, optimizer_state_bytes=6000, step_peak_bytes=8000)
    plan = solve(chain, model, 9000)
    assert plan.feasible and plan.offload_optimizer and plan.overhead_s == pytest.approx(2 * 6000 / 1e6)
    assert not solve(chain, Model(bandwidth=1e6), 9000).feasible


def test_curve_spans_leanest_to_unconstrained() -> None:
    chain = random_chain(random.Random(3), 5)
    curve = tradeoff_curve(chain, Model(bandwidth=1e6), points=5)
    assert curve[-1].overhead_s == 0.0 and curve[-1].modules_count == 0
    assert [p.budget_bytes for p in curve] == sorted(p.budget_bytes for p in curve)
    assert all(a.overhead_s >= b.overhead_s for a, b in zip(curve, curve[1:]))


def random_timeline(rng: random.Random, n: int) -> ChainMemory:
    """A chain's measured-timeline summary (``peak_model``) with plausible orderings."""
    blocks = []
    for i in range(n):
        saving = rng.randint(1, 50)
        fmax = 100 + 40 * i + rng.randint(0, 30)
        bmax = fmax - rng.randint(0, 20)
        blocks.append(BlockMemory(name=f"blocks.{i}", saving_bytes=saving, forward_max=fmax,
                                  forward_max_own=fmax - saving // 2, backward_max=bmax,
                                  recompute_peak=bmax + rng.randint(-10, 30), offload_bytes=saving + rng.randint(0, 20)))
    between = blocks[-1].forward_max + rng.randint(0, 40)
    return ChainMemory(step=1, blocks=tuple(blocks), outside_bytes=rng.randint(0, 80), between_bytes=between,
                       measured_peak_bytes=max([between] + [b.forward_max for b in blocks]))


@pytest.mark.parametrize("seed", range(40))
def test_simulated_joint_solver_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    chain = random_chain(rng, rng.randint(1, 6))
    memory = random_timeline(rng, chain.n)
    state = rng.choice([0, rng.randint(10, 60)])
    model = Model(bandwidth=rng.choice([1e5, 1e6, 1e7]), optimizer_state_bytes=state,
                  step_peak_bytes=rng.randint(0, 150), overlap=rng.random() < 0.8)
    allowed = rng.choice([(KEEP, RECOMPUTE, OFFLOAD), (KEEP, RECOMPUTE), (KEEP, OFFLOAD)])
    low = brute_force(chain, model, 0, allowed=allowed, memory=memory).peak_bytes
    for frac in (0.0, 0.3, 0.6, 0.9, 1.0):
        budget = int(low + frac * (memory.measured_peak_bytes - low))
        dp = solve(chain, model, budget, allowed=allowed, memory=memory)
        bf = brute_force(chain, model, budget, allowed=allowed, memory=memory)
        assert dp.feasible == bf.feasible, (budget, dp, bf)
        if bf.feasible:
            assert dp.overhead_s == pytest.approx(bf.overhead_s, abs=1e-12), (budget, dp, bf)
            assert dp.peak_bytes <= budget
        else:
            assert dp.peak_bytes == bf.peak_bytes
        assert evaluate(chain, model, dp.choices, dp.offload_optimizer, memory) == (
            dp.peak_bytes, pytest.approx(dp.overhead_s))


def test_simulated_peak_counts_the_prefetched_block() -> None:
    """Offloaded after offloaded: the earlier block's bytes are back during the later one's backward."""
    memory = random_timeline(random.Random(3), 4)
    b0, b1 = memory.blocks[0], memory.blocks[1]
    bare = replace(memory, blocks=(replace(b0, backward_max=0, forward_max=0),
                                   replace(b1, backward_max=10_000, forward_max=0)) + memory.blocks[2:],
                   between_bytes=0, outside_bytes=0)
    assert choices_peak(bare, (OFFLOAD, OFFLOAD, KEEP, KEEP)) == 10_000  # b0's saving is undone by the prefetch
    assert choices_peak(bare, (OFFLOAD, KEEP, KEEP, KEEP)) == 10_000 - b0.offload_bytes
    assert choices_peak(bare, (RECOMPUTE, OFFLOAD, KEEP, KEEP)) == 10_000 - b0.saving_bytes  # no prefetch after R
