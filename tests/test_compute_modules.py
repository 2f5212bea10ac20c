"""Backward ops go to the module whose forward created their autograd node (issue 21, item 3)."""

from __future__ import annotations

import torch
import torch.nn as nn
from fakes import FakeContext

from advisor.probes.compute import ComputeProbe
from advisor.probes.memory import MemoryProbe
from advisor.records.samples import ModuleStat, OpStat


class PassThrough(nn.Module):
    """Linear, Linear, a Dropout(p=0) that returns its input unchanged, an in-place ReLU, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc0 = nn.Linear(64, 64)
        self.fc1 = nn.Linear(64, 256)
        self.drop = nn.Dropout(p=0.0)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(256, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.drop(self.fc1(self.fc0(x)))))


def _step(model: nn.Module, opt: torch.optim.Optimizer, ctx: FakeContext, x: torch.Tensor) -> None:
    ctx.phase = "forward"
    loss = model(x).square().mean()
    ctx.phase = "backward"
    loss.backward()
    ctx.phase = "optimizer"
    opt.step()
    opt.zero_grad()
    ctx.phase = "data"


def _backward_ops(records: list, module: str) -> list[OpStat]:
    return [r for r in records if isinstance(r, OpStat) and r.phase == "backward" and r.module == module]


def test_pass_through_module_gets_no_backward_ops_and_the_next_keeps_its_own() -> None:
    torch.manual_seed(0)
    model = PassThrough()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx = FakeContext([model], [opt])
    x = torch.randn(32, 64)
    probe = ComputeProbe()
    for step in (0, 1):  # counted, then timed
        ctx.step = step
        probe.start_deep(ctx, step)
        _step(model, opt, ctx, x)
        probe.stop_deep(ctx, step)
    ops = ctx.emitted
    assert _backward_ops(ops, "drop") == []
    fc2 = _backward_ops(ops, "fc2")
    # fc2's backward: the input gradient (256x32 weight) and the weight gradient, both matmuls.
    assert sum(o.flops for o in fc2 if o.name == "aten.mm") == 2 * (2 * 32 * 256 * 32)
    assert sum(o.time_s for o in fc2) > 0
    relu = _backward_ops(ops, "act")
    assert "aten.threshold_backward" in {o.name for o in relu}
    fc1 = _backward_ops(ops, "fc1")
    assert sum(o.flops for o in fc1 if o.name == "aten.mm") == 2 * (2 * 32 * 64 * 256)
    # The first layer's input needs no gradient: its weight gradient is its whole backward.
    fc0 = _backward_ops(ops, "fc0")
    assert sum(o.flops for o in fc0 if o.name == "aten.mm") == 2 * 32 * 64 * 64


def test_memory_probe_backward_time_follows_the_same_nodes() -> None:
    torch.manual_seed(0)
    model = PassThrough()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx = FakeContext([model], [opt])
    probe = MemoryProbe(scan_gc=False)
    probe.attach(ctx)
    probe.start_deep(ctx, 0)
    _step(model, opt, ctx, torch.randn(32, 64))
    probe.stop_deep(ctx, 0)
    probe.detach(ctx)
    stats = {s.name: s for s in ctx.emitted if isinstance(s, ModuleStat)}
    assert stats["drop"].backward_s == 0.0
    assert stats["fc2"].backward_s > 0.0
    assert stats["fc0"].backward_s > 0.0
