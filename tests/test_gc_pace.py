"""The garbage collector keeps the script's pace on deep steps (advisor/agent/gc_pace.py): the
agent's own allocations there would otherwise run the middle-generation passes dozens of times as
often and push the step's live objects into the oldest generation (a full collection each deep
step)."""

from __future__ import annotations

import gc

import pytest
import torch

from advisor.agent.agent import Agent
from advisor.agent.gc_pace import FACTOR, GcPace
from advisor.probes.probe import Probe
from advisor.records.settings import AgentSettings
from fakes import Emitted
from test_agent import _train_linear


@pytest.fixture(autouse=True)
def _thresholds():
    saved, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)
    (gc.enable if enabled else gc.disable)()


def test_deep_steps_run_at_a_slower_young_threshold_and_light_steps_at_the_scripts():
    seen: list[tuple[str, int, tuple[int, ...]]] = []

    class Watch(Probe):
        name = "watch"

        def start_deep(self, ctx, step):
            seen.append(("start", step, gc.get_threshold()))

        def stop_deep(self, ctx, step):
            seen.append(("stop", step, gc.get_threshold()))

    _train_linear(Agent(emit=Emitted().append, settings=AgentSettings(deep_steps=(1, 2)), probes=[Watch()]), 4)
    assert seen == [(event, step, (700, 10 * FACTOR, 10)) for step in (1, 2) for event in ("start", "stop")]
    assert gc.get_threshold() == (700, 10, 10)


def test_the_scripts_own_choice_stands_and_a_disabled_collector_is_left_alone():
    pace = GcPace()
    pace.slow()
    assert gc.get_threshold() == (700, 10 * FACTOR, 10)
    gc.set_threshold(100, 5, 5)  # the script sets its own during a deep step
    pace.restore()
    assert gc.get_threshold() == (100, 5, 5)

    gc.disable()
    pace.slow()
    pace.restore()
    assert gc.get_threshold() == (100, 5, 5) and not gc.isenabled()


def test_a_deep_step_cut_short_gives_the_script_its_pace_back():
    """A script that ends (or an in-process session that closes) inside a deep step: the slowed
    collector must not outlive the agent's hooks (the rest of the process would keep it)."""
    from advisor.agent.hooks import install

    agent = Agent(emit=Emitted().append, settings=AgentSettings(deep_steps=(1,)))
    hooks = install(agent)
    try:
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(1):  # step 1 starts deep at the boundary after it, and never ends
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        assert gc.get_threshold() == (700, 10 * FACTOR, 10)
    finally:
        hooks.remove()
    assert gc.get_threshold() == (700, 10, 10)
