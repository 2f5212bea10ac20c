"""Checkpointing solver benchmark: speed on long chains, optimality, and against Chen's sqrt(n).

Run: python bench/solver.py   (pure numpy; no torch)
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.recommend.remedies.checkpoint_solver import brute_force, chen_sqrt_n, min_peak_plan, solve_chain  # noqa: E402
from advisor.recommend.memory_model import Block, Chain  # noqa: E402

MIB = 2**20


def gpt_chain(rng: random.Random, n: int) -> Chain:
    """GPT-like: equal block activations (34 sbh-ish) and boundaries (2 sbh), jittered forward times."""
    blocks = tuple(
        Block(name=f"blocks.{i}", activation_bytes=68 * MIB, input_bytes=4 * MIB, output_bytes=4 * MIB,
              forward_s=0.01 * rng.uniform(0.9, 1.1))
        for i in range(n)
    )
    return Chain(blocks=blocks, fixed_bytes=2000 * MIB, other_activation_bytes=64 * MIB)


def random_chain(rng: random.Random, n: int) -> Chain:
    blocks, out = [], rng.randint(1, 60)
    for i in range(n):
        x, out = out, rng.randint(1, 60)
        blocks.append(Block(name=f"blocks.{i}", activation_bytes=rng.randint(1, 500), input_bytes=x, output_bytes=out,
                            forward_s=rng.uniform(0.001, 0.02)))
    return Chain(blocks=tuple(blocks), fixed_bytes=rng.randint(0, 1000), other_activation_bytes=rng.randint(0, 200))


def budget_at(chain: Chain, share: float) -> int:
    low = min_peak_plan(chain).peak_bytes
    return int(low + share * (chain.baseline_peak_bytes - low))


def speed(rng: random.Random) -> None:
    print("1. long chains: solve time")
    for label, chain in (("gpt-like", gpt_chain(rng, 500)), ("random sizes", random_chain(rng, 500))):
        for share in (0.25, 0.5, 0.9):
            budget = budget_at(chain, share)
            start = time.perf_counter()
            plan = solve_chain(chain, budget)
            elapsed = time.perf_counter() - start
            print(f"   {label:13} n=500 budget share {share:.2f}: {elapsed:6.3f} s, fits={plan.feasible}, "
                  f"{len(plan.indices)} blocks, exact={plan.exact}")


def optimality(rng: random.Random, cases: int = 300) -> None:
    gap, infeasible_agree = 0.0, 0
    for _ in range(cases):
        chain = random_chain(rng, 12)
        low = brute_force(chain, 0).peak_bytes
        budget = rng.randint(low - 20, chain.baseline_peak_bytes)
        plan, best = solve_chain(chain, budget), brute_force(chain, budget)
        if plan.feasible != best.feasible:
            gap = float("inf")
        elif best.feasible:
            gap = max(gap, plan.overhead_s - best.overhead_s)
        else:
            infeasible_agree += 1
    print(f"2. solver vs brute force, {cases} random chains of 12: max gap = {gap:.3g} s "
          f"({infeasible_agree} infeasible budgets, both said so)")


def against_chen(rng: random.Random) -> None:
    print("3. recompute overhead at Chen's sqrt(n) budget (checkpoint every ceil(sqrt n)-th block)")
    print(f"   {'chain':>16} {'n':>4} {'budget':>12} {'chen s':>8} {'solver peak':>12} {'solver s':>8} {'saved':>6}")
    for label, make in (("gpt-like", gpt_chain), ("random sizes", random_chain)):
        for n in (12, 48, 200):
            chain = make(rng, n)
            chen = chen_sqrt_n(chain)
            plan = solve_chain(chain, chen.peak_bytes)
            saved = 1 - plan.overhead_s / chen.overhead_s if chen.overhead_s else 0.0
            print(f"   {label:>16} {n:>4} {chen.peak_bytes:>12} {chen.overhead_s:>8.4f} "
                  f"{plan.peak_bytes:>12} {plan.overhead_s:>8.4f} {saved:>6.0%}")


def main() -> int:
    rng = random.Random(0)
    speed(rng)
    optimality(rng)
    against_chen(rng)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
