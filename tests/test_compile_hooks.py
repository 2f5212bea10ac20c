"""The agent's global hooks are invisible to torch.compile (issue 21, item 11).

Dynamo traces a compiled model's submodule calls, global hooks included. Hooks that touch
the agent's state there cause recompiles (guards on that state) or graph breaks; the
hooks return at once while dynamo traces. Counted with dynamo's own counters on CPU with
the eager backend (dynamo's tracing, no code generation: fast).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from advisor.agent.agent import Agent
from advisor.agent.hooks import install
from advisor.records.samples import ModelInfo
from advisor.records.settings import AgentSettings
from fakes import Emitted


def _train_compiled(steps: int = 4) -> tuple[int, int, list[float]]:
    """(graph breaks, graphs compiled, losses) of a small compiled model's training."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(inplace=True), torch.nn.Dropout(0.0),
                                torch.nn.Linear(16, 1))
    with warnings.catch_warnings():  # "global hooks fire an extra time for the OptimizedModule"
        warnings.simplefilter("ignore", UserWarning)
        compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = compiled(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"], losses


def test_compiled_model_has_no_more_graph_breaks_or_recompiles_under_the_agent():
    bare = _train_compiled()
    emitted = Emitted()
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=()))
    hooks = install(agent)
    try:
        attached = _train_compiled()
        agent.flush(sync=True)
    finally:
        hooks.remove()
    assert attached[:2] == bare[:2]
    assert attached[2] == bare[2]
    # The hooks still saw the compiled module's own call: the model and its steps are found.
    assert [(m.name, m.wrapper) for m in emitted if isinstance(m, ModelInfo)] == [("Sequential", "OptimizedModule")]
    assert agent.step == 4


class _Net(torch.nn.Module):
    """No container: truth-testing its compiled form raises (OptimizedModule forwards __len__)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize(("how", "deep_compiled"), [("wrapped", False), ("in_place", False), ("wrapped", True)])
def test_a_compiled_model_is_not_deep_sampled_through_dispatch_modes(how: str, deep_compiled: bool) -> None:
    """Under the memory tracker's and the op counter's dispatch modes a compiled model runs other code
    than its graph: nanoGPT compiled with inductor ended three steps 7e-9 away from its bare weights."""
    from advisor.probes.compute.probe import ComputeProbe
    from advisor.probes.memory.probe import MemoryProbe
    from advisor.records.samples import Event, StepSample

    torch._dynamo.reset()
    emitted = Emitted()
    agent = Agent(emit=emitted.append, probes=[MemoryProbe(scan_gc=False), ComputeProbe()],
                  settings=AgentSettings(deep_steps=(1, 2, 3), deep_every=0, deep_compiled=deep_compiled))
    hooks = install(agent)
    try:
        torch.manual_seed(0)
        net = _Net()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            if how == "wrapped":
                model: torch.nn.Module = torch.compile(net, backend="eager")
            else:
                net.compile(backend="eager")
                model = net
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(5):
            model(torch.randn(4, 8)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        agent.flush(sync=True)
    finally:
        hooks.remove()
    steps = [r for r in emitted if isinstance(r, StepSample)]
    left_off = [r for r in emitted if isinstance(r, Event) and r.name == "deep_probes_left_off"]
    if deep_compiled:
        assert not left_off
        assert any(s.deep for s in steps)
    else:
        assert [e.data["probes"] for e in left_off] == [["compute", "memory"]]
        assert not any(s.deep for s in steps)
        assert any(r.name == "warning" and "--deep-compiled" in r.data["message"]
                   for r in emitted if isinstance(r, Event))
