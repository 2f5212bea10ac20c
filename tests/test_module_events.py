"""Probes follow module forwards through the context's one hook set when it offers one."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from fakes import Emitted, FakeContext
from torch.nn.modules import module as module_hooks

from advisor.probes.compute import ComputeProbe
from advisor.probes.memory import MemoryProbe
from advisor.probes.module_events import ModuleEvents
from advisor.records.samples import ModuleStat, OpStat


class SharedHooksContext(FakeContext):
    """A context that, like the agent, owns the only pair of global module hooks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events = ModuleEvents()

    def subscribe_module_events(self, pre, post):
        return self.events.subscribe(pre, post)


def test_probes_use_the_contexts_module_events_and_install_no_hooks(monkeypatch) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.0), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = SharedHooksContext([model], [opt])
    handles = [module_hooks.register_module_forward_pre_hook(ctx.events.pre),
               module_hooks.register_module_forward_hook(ctx.events.post)]

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("a probe installed a global module hook of its own")

    monkeypatch.setattr(module_hooks, "register_module_forward_pre_hook", refuse)
    monkeypatch.setattr(module_hooks, "register_module_forward_hook", refuse)
    probes = [MemoryProbe(scan_gc=False), ComputeProbe()]
    x = torch.randn(8, 16)
    try:
        probes[0].attach(ctx)
        for step in (0, 1):  # counted, then timed
            ctx.step = step
            for probe in probes:
                probe.start_deep(ctx, step)
            assert ctx.events  # subscribed while deep
            ctx.phase = "forward"
            loss = model(x).square().mean()
            ctx.phase = "backward"
            loss.backward()
            ctx.phase = "optimizer"
            opt.step()
            opt.zero_grad()
            for probe in reversed(probes):
                probe.stop_deep(ctx, step)
            assert not ctx.events  # and gone after
        probes[0].detach(ctx)
    finally:
        for handle in handles:
            handle.remove()
    stats = {s.name: s for s in ctx.emitted if isinstance(s, ModuleStat)}
    assert stats["3"].calls == 1 and stats["3"].backward_s > 0 and stats["1"].backward_s == 0.0
    backward = {(o.module, o.name) for o in ctx.emitted if isinstance(o, OpStat) and o.phase == "backward"}
    assert ("3", "aten.mm") in backward and not any(module == "1" for module, _ in backward)


def test_the_real_agent_serves_every_probe_from_its_one_hook_pair() -> None:
    """Under the agent, a deep step runs with exactly the agent's global forward hooks: the memory
    and compute probes subscribe to its events instead of adding their own pairs."""
    from torch.nn.modules import module as nn_module

    from advisor.agent.agent import Agent
    from advisor.agent.hooks import install
    from advisor.agent.probe_registry import build_probes
    from advisor.records.samples import ModuleStat
    from advisor.records.settings import AgentSettings

    counts: list[tuple[int, int]] = []
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    records = Emitted()
    settings = AgentSettings(probes=("memory", "compute"), deep_steps=(1,))
    probes, warnings = build_probes(settings)
    assert not warnings
    agent = Agent(emit=records.append, settings=settings, probes=probes)
    before = (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks))
    hooks = install(agent)
    try:
        gen = torch.Generator().manual_seed(0)
        for _ in range(3):
            loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
            counts.append((len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks)))
            opt.zero_grad()
            loss.backward()
            opt.step()
        agent.flush(sync=True)
    finally:
        hooks.remove()
        agent.close()
    assert counts == [(before[0] + 1, before[1] + 1)] * 3  # deep step 1 included
    assert any(isinstance(r, ModuleStat) and r.step == 1 for r in records)  # the probes did see modules
