"""Two gloo ranks training a small DDP model, driving the apply executor as the agent would.

Scenarios (argument ``scenario``):
- ``none``: no apply; the undisturbed losses.
- ``fail_on_1``: a test remedy that multiplies the learning rate is applied at step 3; on rank 1
  it raises. Both ranks must revert before a step runs with it.
- ``keep``: the same remedy with factor 1.0 on both ranks: kept by both.
- ``slow_on_1``: factor 1.0, but rank 1 reports 10x step times after the apply (a slowdown only
  it sees): both ranks revert at the end of the window.
- ``absent_1``: rank 1 never receives the command; rank 0 waits for it to agree on a step, times
  out, and applies nothing.
- ``late_on_1``: factor 1.0, asked for a step already past (as a controller that lags the ranks
  does); rank 1's copy arrives only after its boundary 3 (on a thread, as the agent's socket
  reader does), rank 0's before it. Both must still apply at one boundary and keep it.
- ``plan_fail_on_1``: the same 10x remedy from a plan, before the first step; it fails on rank 1,
  so rank 0 reverts its entry too.

Each rank writes ``rank<r>.json``: its losses and the apply results it emitted.
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
from recommendations import wire  # noqa: E402

from advisor.apply import registry  # noqa: E402
from advisor.apply.executor import Executor  # noqa: E402
from advisor.apply.plan import apply_plan_before_first_step  # noqa: E402
from advisor.records.plan import Plan, PlanEntry  # noqa: E402
from advisor.records.samples import StepSample  # noqa: E402
from advisor.records.settings import AgentSettings  # noqa: E402

STEPS = 12
AT_STEP = 3


@dataclass
class _LrHandle:
    opt: torch.optim.Optimizer
    previous: list[float]

    def revert(self) -> None:
        for group, lr in zip(self.opt.param_groups, self.previous):
            group["lr"] = lr


def _scale_lr(fail: bool):
    def apply_scale_lr(target, *, factor: float) -> _LrHandle:
        [opt] = target.optimizers
        previous = [g["lr"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["lr"] *= factor
        if fail:
            for g, lr in zip(opt.param_groups, previous):  # atomic: undo before raising
                g["lr"] = lr
            raise RuntimeError("injected failure on this rank")
        return _LrHandle(opt, previous)

    return apply_scale_lr


def worker(rank: int, world: int, port: int, scenario: str, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        ctx = FakeContext([ddp], [opt], rank=rank, world_size=world, settings=AgentSettings(apply_agree_timeout_s=5))
        ex = Executor(ctx)
        registry.register("scale_lr", _scale_lr(scenario in ("fail_on_1", "plan_fail_on_1") and rank == 1))
        factor = 10.0 if scenario == "fail_on_1" else 1.0
        if scenario == "plan_fail_on_1":
            plan = Plan(remedies=(PlanEntry(remedy="scale_lr", params={"factor": 10.0}, recommendation_id="p"),))
            apply_plan_before_first_step(ctx, plan, model=ddp, executor=ex)
        gen = torch.Generator().manual_seed(100 + rank)
        losses = []
        command = {"type": "apply", "at_step": AT_STEP, "measure_steps": 1,
                   "recommendation": wire("lr", "scale_lr", params={"factor": factor})}
        passed_3 = threading.Event()
        late = None
        if scenario == "late_on_1" and rank == 1:
            late = threading.Thread(target=lambda: (passed_3.wait(), ex.submit({**command, "at_step": 1})))
            late.start()
        for i in range(STEPS):
            ctx.step = i
            if i == 1 and scenario not in ("none", "plan_fail_on_1", "late_on_1") and not (
                    scenario == "absent_1" and rank == 1):
                ex.submit(command)
            if i == 3 and scenario == "late_on_1" and rank == 0:
                ex.submit({**command, "at_step": 1})
            ex.on_boundary(i)
            if i == 3:
                passed_3.set()
            x = torch.randn(8, 16, generator=gen)
            loss = ddp(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            slow = scenario == "slow_on_1" and rank == 1 and i >= AT_STEP
            ex.on_step_end(StepSample(index=i, rank=rank, time_s=1.0 if slow else 0.1, deep=False))
        ex.close()
        if late is not None:
            late.join()
        results = [r.to_dict() for r in ex.results]
        if scenario == "plan_fail_on_1":  # the plan path emits its results directly
            results = [e.data for e in ctx.of_kind("event") if e.name == "apply_result"]
        Path(out, f"rank{rank}.json").write_text(json.dumps({"losses": losses, "results": results}))
    finally:
        dist.destroy_process_group()
