"""The agent captures what the script builds, and remedies act on those very objects."""

from __future__ import annotations

import torch
from recommendations import wire

from advisor.agent.agent import Agent
from advisor.agent.hooks import install
from advisor.apply.executor import Executor
from advisor.records.settings import AgentSettings


def test_the_target_holds_the_scripts_optimizer_scheduler_and_models_and_a_remedy_changes_them() -> None:
    emitted: list = []
    # Step times here are noise: a huge margin keeps the keep/revert verdict out of this test.
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=(), apply_time_margin=1e9))
    hooks = install(agent)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=True)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        ex = agent.executor = Executor(agent.context)  # the agent calls its executor at each boundary
        for step in range(6):
            if step == 1:
                ex.submit({"type": "apply", "at_step": 2, "measure_steps": 1,
                           "recommendation": wire("f", "fused_optimizer")})
            model(torch.ones(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        target = agent.objects.target()
    finally:
        hooks.remove()
    assert target.optimizers == [opt] and target.lr_schedulers == [sched]
    assert target.models == [model] and target.wrapped_models == [model]
    assert target.process_group is None and target.device == torch.device("cpu")
    # The loop's own optimizer object switched kernels; the scheduler still drives it.
    assert opt.param_groups[0]["fused"] is True and sched.optimizer is opt
    assert opt.param_groups[0]["lr"] == 0.1 * 0.5**6
    [started] = [e for e in emitted if getattr(e, "name", None) == "apply_started"]
    assert started.step == 2 and started.data["digest"]
    assert [(r.status, r.at_step) for r in ex.results] == [("kept", 2)]


def test_retarget_optimizer_points_the_schedulers_at_the_replacement() -> None:
    from advisor.apply.target import Target

    model = torch.nn.Linear(2, 2)
    old = torch.optim.SGD(model.parameters(), lr=1.0)
    new = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(old, step_size=1)
    target = Target(wrapped_models=[model], optimizers=[old], lr_schedulers=[sched])
    target.retarget_optimizer(old, new)
    assert sched.optimizer is new and target.optimizers == [new]
