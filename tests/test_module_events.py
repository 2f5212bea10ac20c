"""Probes follow module forwards through the context's one hook set when it offers one."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from fakes import FakeContext
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
