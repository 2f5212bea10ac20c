"""Two gloo ranks whose user revert arrives at different steps, driving the apply executor.

A test remedy halves the learning rate at step ``AT_STEP`` (kept: both ranks measure the same
step times). The revert command then reaches rank 0 before its boundary ``SEEN`` and rank 1 only
after it (on a thread, as the agent's socket reader receives it), carrying ``at_step=REVERT_AT``
as the controller sends it, or no step (``voted`` False). Each rank
writes ``rank<r>.json``: its losses, the ``apply_reverted`` events it emitted, and its parameters
at the end (DDP keeps them equal only if both ranks ran every step with the same learning rate).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

from fakes import FakeContext  # noqa: E402
from recommendations import recommendation  # noqa: E402

from advisor.apply import registry  # noqa: E402
from advisor.apply.executor import Executor  # noqa: E402
from advisor.records.commands import ApplyCommand, RevertCommand  # noqa: E402
from advisor.records.samples import StepSample  # noqa: E402
from advisor.records.settings import AgentSettings  # noqa: E402

STEPS = 14
AT_STEP = 2
SEEN = 6  # rank 0 receives the revert before this boundary, rank 1 after it
REVERT_AT = 9


@dataclass
class _LrHandle:
    opt: torch.optim.Optimizer
    previous: list[float]

    def revert(self) -> None:
        for group, lr in zip(self.opt.param_groups, self.previous):
            group["lr"] = lr


def apply_halve_lr(target, *, factor: float) -> _LrHandle:
    [opt] = target.optimizers
    previous = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] *= factor
    return _LrHandle(opt, previous)


def worker(rank: int, world: int, port: int, voted: bool, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        ctx = FakeContext([ddp], [opt], rank=rank, world_size=world, settings=AgentSettings(apply_agree_timeout_s=20))
        ex = Executor(ctx)
        registry.register("halve_lr", apply_halve_lr)
        gen = torch.Generator().manual_seed(100 + rank)
        losses = []
        revert = RevertCommand(at_step=REVERT_AT if voted else None)
        passed = threading.Event()
        late = threading.Thread(target=lambda: (passed.wait(), ex.submit(revert))) if rank == 1 else None
        if late is not None:
            late.start()
        for i in range(STEPS):
            ctx.step = i
            if i == 1:
                ex.submit(ApplyCommand(recommendation=recommendation("lr", "halve_lr", params={"factor": 0.5}),
                                       at_step=AT_STEP, measure_steps=1))
            if i == SEEN and rank == 0:
                ex.submit(revert)
            ex.on_boundary(i)
            if i == SEEN:
                passed.set()
            loss = ddp(torch.randn(8, 16, generator=gen)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            ex.on_step_end(StepSample(index=i, rank=rank, time_s=0.1, deep=False))
        ex.close()
        if late is not None:
            late.join()
        reverted = [e.data for e in ctx.of_kind("event") if e.name == "apply_reverted"]
        params = [p.detach().flatten().tolist() for p in ddp.parameters()]
        Path(out, f"rank{rank}.json").write_text(json.dumps(
            {"losses": losses, "reverted": reverted, "kept": [r.status for r in ex.results], "params": params}))
    finally:
        dist.destroy_process_group()
