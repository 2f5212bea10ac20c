"""Pipeline split benchmark: the planner's predictions beside the in-process pipeline's measurements.

Run: python bench/pipeline.py [--gpus]

1. The planner on a 500-block chain: its time, and its split against the equal-layer split.
2. CPU stages with blocks whose work is a sleep (it releases the GIL, as a device kernel leaves
   the host free): the measured forward of the planned and of the equal-layer split against the
   predicted (m + p - 1)/m * slowest stage. On CPU, autograd runs the whole backward on the caller's
   thread, so only the forward overlaps here; on GPUs each device's backward has its own thread.
3. The GPT of examples/gpt.py on CPU stages: step time unsplit and split (the machinery's cost).
4. With two or more GPUs: the GPT split over them, measured step time and stage-1 peak against
   the planner.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402
from torch import nn  # noqa: E402

from advisor.apply.remedies.pipeline import apply_pipeline  # noqa: E402
from advisor.recommend.remedies.pipeline_planner import (  # noqa: E402
    PipeBlock,
    brute_force,
    evaluate,
    min_max_partition,
    plan_pipeline,
)
from pipeline_models import Target, train_gpt  # noqa: E402


def planner_speed() -> None:
    rng = random.Random(0)
    blocks = [PipeBlock(name=f"blocks.{i}", forward_s=rng.uniform(0.5, 2) * 1e-3, backward_s=rng.uniform(1, 4) * 1e-3,
                        activation_bytes=rng.randint(50, 150) * 2**20, parameter_bytes=rng.randint(20, 60) * 2**20,
                        optimizer_bytes=rng.randint(40, 120) * 2**20, output_bytes=8 * 2**20) for i in range(500)]
    for p in (4, 8):
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            plan = plan_pipeline(blocks, stages=p, memory_bytes=80 * 2**30, bandwidth_bytes_s=25e9)
            runs.append(time.perf_counter() - start)
        b, n = plan.best, plan.naive
        print(f"planner, 500 blocks, p={p}: {statistics.median(runs) * 1e3:.0f} ms ({plan.candidates} DPs); "
              f"m={b.micro_batches} {b.schedule}; imbalance {b.imbalance:.3f} vs equal split {n.imbalance:.3f}; "
              f"step {b.step_time_s * 1e3:.1f} vs {n.step_time_s * 1e3:.1f} ms; bubble {b.bubble_fraction:.1%}; "
              f"peak {b.max_peak_bytes / 2**30:.1f} vs {n.max_peak_bytes / 2**30:.1f} GiB")
    agree = 0
    for trial in range(40):
        small = blocks[trial:trial + rng.randint(4, 10)]
        p = rng.randint(2, min(4, len(small)))
        dp = min_max_partition(small, p, micro_batches=4, schedule="1f1b")
        bf = brute_force(small, p, micro_batches=4, schedule="1f1b")
        assert dp is not None and bf is not None
        agree += max(evaluate(small, dp, micro_batches=4, schedule="1f1b").stage_time_s) == max(bf.stage_time_s)
    print(f"DP optimum equals brute force on {agree}/40 random small chains")


class _SleepFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, fwd: float, bwd: float) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd = bwd
        time.sleep(fwd)
        return x * 1.0

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        time.sleep(ctx.bwd)
        return grad, None, None


class SleepBlock(nn.Module):
    """Work proportional to the samples it gets: ``cost`` seconds of forward per whole batch."""

    def __init__(self, cost: float, batch: int) -> None:
        super().__init__()
        self.cost, self.batch = cost, batch
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        share = x.shape[0] / self.batch
        return _SleepFn.apply(x, self.cost * share, 2 * self.cost * share) * self.scale


def sleep_chain(m: int = 8, batch: int = 32) -> None:
    costs = [0.004] * 6 + [0.024, 0.024]
    blocks = [PipeBlock(name=str(i), forward_s=c, backward_s=2 * c, activation_bytes=0, parameter_bytes=4,
                        optimizer_bytes=0, output_bytes=0) for i, c in enumerate(costs)]
    plan = plan_pipeline(blocks, stages=3, micro_batches=[m], schedules=("gpipe",))
    x = torch.randn(batch, 4)
    serial_model = nn.Sequential(*(SleepBlock(c, batch) for c in costs))
    serial = statistics.median(_timed_forward(serial_model, x) for _ in range(3))
    print(f"sleep chain {[c * 1e3 for c in costs]} ms, 3 CPU stages, m={m}; unsplit forward {serial * 1e3:.1f} ms")
    for label, figures in (("planned", plan.best), ("equal-layer", plan.naive)):
        model = nn.Sequential(*(SleepBlock(c, batch) for c in costs))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        handle = apply_pipeline(Target(model, opt), stages=[list(s) for s in figures.stages], micro_batches=m,
                                devices=["cpu"] * 3)
        model(x).sum().backward()  # verifies
        measured = statistics.median(_timed_forward(model, x) for _ in range(3))
        fwd_slowest = max(sum(costs[int(n)] for n in s) for s in figures.stages)
        predicted = (m + 2) / m * fwd_slowest
        handle.revert()
        print(f"  {label:11s} {[len(s) for s in figures.stages]}: forward {measured * 1e3:.1f} ms, predicted "
              f"{predicted * 1e3:.1f} ms (ratio {measured / predicted:.2f}); planner step (GPU, backward overlapped) "
              f"{figures.step_time_s * 1e3:.1f} ms, imbalance {figures.imbalance:.2f}")


def _timed_forward(model: nn.Module, x: torch.Tensor) -> float:
    start = time.perf_counter()
    out = model(x)
    elapsed = time.perf_counter() - start
    out.sum().backward()
    return elapsed


def gpt_cpu(steps: int = 12) -> None:
    times: dict[str, list[float]] = {"unsplit": [], "split": []}
    for label in times:
        marks: list[float] = []

        def at(step: int, target: Target, label: str = label, marks: list[float] = marks) -> None:
            marks.append(time.perf_counter())
            if step == 1 and label == "split":
                apply_pipeline(target, stages=[["blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]], micro_batches=4,
                               devices=["cpu", "cpu"])

        train_gpt(steps, at, hidden=64, batch=16)
        times[label] = [b - a for a, b in zip(marks[3:], marks[4:])]
    u, s = statistics.median(times["unsplit"]), statistics.median(times["split"])
    print(f"GPT (4 blocks, hidden 64) on 2 CPU stages, m=4: step {s * 1e3:.1f} ms vs unsplit {u * 1e3:.1f} ms "
          f"(x{s / u:.2f}; the CPU stages share this machine's cores)")


def gpus() -> None:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        print(f"GPUs: {n} visible, the two-GPU measurement needs 2 (tests/test_pipeline_gpu.py has it too)")
        return
    import pytest

    from test_pipeline_gpu import test_measured_stage_peak_and_step_time_match_the_planner_within_15_percent as run
    try:
        run()
        print("GPUs: measured stage-1 peak and step time within 15% of the planner")
    except (AssertionError, pytest.fail.Exception) as exc:
        print(f"GPUs: outside 15%: {exc}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    planner_speed()
    sleep_chain()
    gpt_cpu()
    gpus()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
