"""Tiny distributed training loops for the comm tests: 2 gloo ranks, CommProbe driven by hand.

Each scenario trains a small model for a few steps, calling the probe's hooks around the
phases as the agent would, then writes every emitted record (``to_dict`` with its KIND)
to ``<out>/rank<r>.json`` for the test to analyse in the parent process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

from fakes import FakeContext  # noqa: E402

from advisor.probes.comm.probe import CommProbe  # noqa: E402
from advisor.records.samples import StepSample  # noqa: E402

STEPS = 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def _phase(probe: CommProbe, ctx: FakeContext, name: str) -> None:
    ctx.phase = name
    probe.on_phase(ctx, name, time.perf_counter())


def _loop(
    probe: CommProbe,
    ctx: FakeContext,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    *,
    sleep_before_backward: float = 0.0,
    explicit: torch.Tensor | None = None,
) -> None:
    for step in range(STEPS):
        ctx.step = step
        ctx.step_start = time.perf_counter()
        _phase(probe, ctx, "data")
        x = torch.randn(16, 32)
        _phase(probe, ctx, "forward")
        loss = model(x).square().mean()
        if sleep_before_backward:
            time.sleep(sleep_before_backward)
        _phase(probe, ctx, "backward")
        loss.backward()
        _phase(probe, ctx, "optimizer")
        opt.step()
        opt.zero_grad()
        _phase(probe, ctx, "other")
        if explicit is not None:
            dist.all_reduce(explicit)
        probe.on_step_end(ctx, step)
        # what the agent sends at each step boundary
        ctx.emit(StepSample(index=step, rank=ctx.rank, end_time=time.time(), time_s=time.perf_counter() - ctx.step_start))


def scenario_ddp(probe: CommProbe, ctx: FakeContext, rank: int, arg: float) -> dict:
    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # the straggler scenario: rank 1 sleeps `arg` seconds before each backward
    _loop(probe, ctx, model, opt, sleep_before_backward=arg if rank == 1 else 0.0)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"grad_bytes": grad_bytes}


def scenario_explicit(probe: CommProbe, ctx: FakeContext, rank: int, arg: float) -> dict:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tensor = torch.ones(1000, dtype=torch.float64)
    _loop(probe, ctx, model, opt, explicit=tensor)
    return {"explicit_bytes": tensor.numel() * tensor.element_size(), "value": tensor[0].item()}


def scenario_fsdp(probe: CommProbe, ctx: FakeContext, rank: int, arg: float) -> dict:
    from torch.distributed.fsdp import fully_shard

    model = _model()
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _loop(probe, ctx, model, opt)
    return {"param_bytes": full_bytes}


def scenario_zero(probe: CommProbe, ctx: FakeContext, rank: int, arg: float) -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01)
    _loop(probe, ctx, model, opt)
    return {"grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


SCENARIOS: dict[str, Callable[[CommProbe, FakeContext, int, float], dict]] = {
    "ddp": scenario_ddp,
    "explicit": scenario_explicit,
    "fsdp": scenario_fsdp,
    "zero": scenario_zero,
}


def worker(rank: int, world_size: int, port: int, scenario: str, out: str, arg: float) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        ctx = FakeContext(rank=rank, world_size=world_size)
        probe = CommProbe()
        probe.attach(ctx)
        info = SCENARIOS[scenario](probe, ctx, rank, arg)
        probe.detach(ctx)
        records = [{"kind": r.KIND, **r.to_dict()} for r in ctx.emitted]
        Path(out, f"rank{rank}.json").write_text(json.dumps({"info": info, "records": records}))
        dist.barrier()
    finally:
        dist.destroy_process_group()
