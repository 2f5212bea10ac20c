"""A light step's top-level forward runs its modules without the agent's global hooks
(``advisor/agent/forward_hooks.py``); deep steps, compiled code and the script's own files see
what they saw before."""

from __future__ import annotations

import copy
import io
import pickle
import sys

import pytest
import torch
from fakes import Emitted
from torch import nn
from torch.nn.modules import module as nn_module

from advisor.agent.agent import Agent
from advisor.agent.forward_hooks import ForwardHooks
from advisor.agent.hooks import install
from advisor.records.samples import StepSample
from advisor.records.settings import AgentSettings


class Interrupt(nn.Module):
    """Ctrl-C landing inside a forward (module level: a test pickles it)."""

    def forward(self, x):
        raise KeyboardInterrupt


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.ReLU(), nn.Linear(16, 16)), nn.Linear(16, 1))


def forget_compiles() -> None:
    """Dynamo's counters are the process's: a compile in an earlier test keeps the pair on for good."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None:
        utils.counters.clear()


def counting_agent() -> tuple[Agent, Emitted, list[nn.Module]]:
    """(agent, emitted, calls): an agent without deep steps, and each module its forward pre-hook sees."""
    emitted = Emitted()
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=()))
    calls: list[nn.Module] = []
    original = agent.forward_pre

    def forward_pre(module):
        calls.append(module)
        return original(module)

    agent.forward_pre = forward_pre
    return agent, emitted, calls


@pytest.fixture
def counted(monkeypatch):
    """(agent, emitted, calls): the agent's hooks installed, and each module its forward pre-hook
    saw; models of any size lifted (these tests' models are small)."""
    forget_compiles()
    monkeypatch.setattr(ForwardHooks, "MIN_MODULES", 2)
    agent, emitted, calls = counting_agent()
    hooks = install(agent)
    try:
        yield agent, emitted, calls
    finally:
        hooks.remove()


def pair() -> tuple[int, int]:
    return len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks)


def test_a_light_forward_calls_the_hooks_for_its_top_level_module_only(counted) -> None:
    agent, emitted, calls = counted
    model, on = net(), pair()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen_inside: list[tuple[int, int]] = []
    model[1].register_forward_pre_hook(lambda module, args: seen_inside.append(pair()))
    depth_in_own_hook: list[int] = []  # the model's own forward hook runs after the agent's, as the global one did
    model.register_forward_hook(lambda module, args, out: depth_in_own_hook.append(agent._fwd_depth))
    for _ in range(3):
        calls.clear()
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        assert calls == [model]  # not its five other modules
    assert seen_inside == [(on[0] - 1, on[1] - 1)] * 3  # the pair off inside the forward
    assert depth_in_own_hook == [0, 0, 0]
    assert pair() == on  # and back on after it
    unsubscribe = agent.module_events.subscribe(lambda m, a: None, lambda m, a, o: None)
    calls.clear()
    model(torch.randn(4, 8))
    unsubscribe()
    assert len(calls) == len(list(model.modules()))  # a deep step's subscriber sees every module
    steps = [r for r in emitted if isinstance(r, StepSample)]
    assert len(steps) == 3 and all(s.phases["forward_s"] > 0 for s in steps)


def test_nothing_of_the_agent_stays_on_the_scripts_module(counted) -> None:
    """A whole-model ``torch.save``, a pickle or a deepcopy right after a forward holds no hook."""
    _, _, _ = counted
    model = net()
    model(torch.randn(2, 8))
    assert not model._forward_hooks and not model._forward_hooks_always_called
    assert not model._forward_pre_hooks
    clone = pickle.loads(pickle.dumps(model))
    assert not clone._forward_hooks and not copy.deepcopy(model)._forward_hooks


def test_two_top_level_forwards_in_a_row_are_both_seen(counted) -> None:
    """A teacher's forward under no_grad, then the student's: the second one starts the forward phase."""
    agent, _, calls = counted
    teacher, student = net(), net()
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    for _ in range(2):
        calls.clear()
        x = torch.randn(4, 8)
        with torch.no_grad():
            target = teacher(x)
        assert agent.clock.phase == "eval"
        out = student(x)
        assert agent.clock.phase == "forward"
        (out - target).square().mean().backward()
        opt.step()
        opt.zero_grad()
        assert calls == [teacher, student]


def test_a_forward_that_raises_puts_the_pair_back(counted) -> None:
    agent, _, calls = counted
    model, on = net(), pair()

    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    model.append(Boom())
    with pytest.raises(ValueError):
        model(torch.randn(2, 8))
    assert pair() == on
    model = model[:3]  # a forward that works: seen as top level again (the depth went back to 0)
    calls.clear()
    model(torch.randn(2, 8))
    assert calls == [model] and pair() == on
    assert not any(m._forward_hooks for m in model.modules())


def test_an_interrupt_in_a_forward_is_mended_at_the_next_event(counted) -> None:
    """KeyboardInterrupt skips always-called hooks: the next backward puts the pair back."""
    _, _, calls = counted
    model, on = net(), pair()

    broken = nn.Sequential(nn.Linear(8, 8), Interrupt())
    with pytest.raises(KeyboardInterrupt):
        broken(torch.randn(2, 8))
    assert pair() != on
    model(torch.randn(2, 8)).sum().backward()  # unseen (the pair is off), then the backward mends
    assert pair() == on and not broken._forward_hooks
    calls.clear()
    model(torch.randn(2, 8))
    assert calls == [model]
    with pytest.raises(KeyboardInterrupt):
        broken(torch.randn(2, 8))
    buffer = io.BytesIO()
    torch.save(broken, buffer)  # ``except KeyboardInterrupt: torch.save(model, path)``: it pickles
    buffer.seek(0)
    assert not torch.load(buffer, weights_only=False)._forward_hooks and pair() == on


def test_a_backward_inside_a_forward_keeps_the_forward_lifted(counted) -> None:
    """A module whose forward runs a backward of its own: the forward is still running, so the
    pair stays off until it ends, and the next forward is a top-level one again."""
    _, _, calls = counted
    on = pair()

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.before, self.after = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            w = torch.ones(1, requires_grad=True)
            (w * 2).sum().backward()
            return self.after(self.before(x))

    model = nn.Sequential(Inner(), nn.Linear(8, 1))
    model(torch.randn(2, 8))
    assert calls == [model] and pair() == on
    calls.clear()
    model(torch.randn(2, 8))
    assert calls == [model]


def test_after_torch_compile_the_pair_stays_on(counted) -> None:
    """Compiled code guards on the global hook dicts: from the first ``torch.compile`` call on,
    every module's call keeps the pair (else a compiled region would be compiled again)."""
    _, _, calls = counted
    eager = net()
    torch.compile(nn.Linear(2, 2), backend="eager")  # never called: the call alone decides
    calls.clear()
    eager(torch.randn(2, 8))
    assert len(calls) == len(list(eager.modules()))


def test_a_checkpoints_recomputation_in_backward_runs_unhooked(counted) -> None:
    """The agent reads no forward inside a backward: the pair is off there too, so recomputing a
    checkpointed block costs what its (lifted) forward did, as the remedy's prediction assumes."""
    from torch.utils.checkpoint import checkpoint

    _, _, calls = counted
    inner = net()

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    model, on = Checkpointed(), pair()
    during: list[tuple[int, int]] = []
    inner[0].register_forward_pre_hook(lambda module, args: during.append(pair()))
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    assert calls == [model]  # the recomputation's six module calls reached no hook of the agent
    assert during == [(on[0] - 1, on[1] - 1)] * 2  # off in the forward and in the recomputation
    assert pair() == on


def test_a_module_compiled_inside_a_forward_is_compiled_once(counted) -> None:
    """A module compiled at its first use inside the model's forward, on a deep step (the pair on:
    dynamo guards on it): the pair stays on from the ``torch.compile`` call, so the light steps
    after it match that trace (lifted, they would compile it again)."""
    from torch._dynamo.utils import counters

    agent, _, _ = counted

    class Lazy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj, self.act = nn.Linear(8, 8), nn.Sequential(nn.Tanh())
            self.compiled: list = []  # not a submodule

        def forward(self, x):
            if not self.compiled:
                self.compiled.append(torch.compile(self.act, backend="eager"))
            return self.compiled[0](self.proj(x))

    torch._dynamo.reset()
    counters.clear()
    model = nn.Sequential(Lazy(), nn.Linear(8, 1))
    unsubscribe = agent.module_events.subscribe(lambda m, a: None, lambda m, a, o: None)  # a deep step
    model(torch.randn(2, 8)).sum().backward()
    unsubscribe()
    for _ in range(2):
        model(torch.randn(2, 8)).sum().backward()
    assert counters["stats"]["unique_graphs"] == 1
    forget_compiles()


def test_the_agents_own_forwards_run_with_the_pair_off(counted) -> None:
    """A checkpoint trial's copy runs inside the agent's quiet context: unhooked, as a light step
    runs the block the trial prices; the pair is back after it."""
    agent, _, calls = counted
    on = pair()
    block = net()
    net()(torch.randn(2, 8))  # the job's model: lifted, so the agent's own forwards are too
    calls.clear()
    with agent._quiet():
        inside = pair()
        block(torch.randn(2, 8)).sum().backward()
    assert inside == (on[0] - 1, on[1] - 1) and pair() == on and calls == []


def test_light_steps_after_deep_ones_with_every_probe_are_lifted(monkeypatch) -> None:
    """Deep steps with every probe (memory, compute, comm: their dispatch modes, profiler, trackers)
    leave nothing that keeps the pair on: the light steps after them call the hooks once."""
    from advisor.agent.probe_registry import build_probes

    forget_compiles()
    monkeypatch.setattr(ForwardHooks, "MIN_MODULES", 2)
    settings = AgentSettings(deep_steps=(1, 2), light_timing_every=0)
    probes, warnings = build_probes(settings)
    assert not warnings
    agent = Agent(emit=Emitted().append, settings=settings, probes=probes)
    calls: dict[int, int] = {}
    original = agent.forward_pre

    def forward_pre(module):
        calls[agent.clock.step] = calls.get(agent.clock.step, 0) + 1
        return original(module)

    agent.forward_pre = forward_pre
    model = net()
    opt = torch.optim.Adam(model.parameters())
    hooks = install(agent)
    try:
        for _ in range(5):
            model(torch.randn(4, 8)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    finally:
        hooks.remove()
        agent.close()
    modules = len(list(model.modules()))
    assert calls[1] == calls[2] == modules  # deep: every module
    assert calls[0] == calls[3] == calls[4] == 1


def test_a_small_model_keeps_the_pair_and_a_large_one_is_lifted() -> None:
    """Lifting costs more than a few modules' hook calls: below ``MIN_MODULES`` the forward and
    its backward keep the pair; at it, both are lifted."""
    forget_compiles()
    agent, _, calls = counting_agent()
    small = net()
    large = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(ForwardHooks.MIN_MODULES // 3 + 1)])
    assert len(list(small.modules())) < ForwardHooks.MIN_MODULES <= len(list(large.modules()))
    hooks = install(agent)
    try:
        during: list[int] = []
        small[0].register_forward_pre_hook(lambda module, args: during.append(len(nn_module._global_forward_pre_hooks)))
        small(torch.randn(2, 8)).sum().backward()
        assert len(calls) == len(list(small.modules())) and during == [pair()[0]]
        calls.clear()
        large(torch.randn(2, 8)).sum().backward()
        assert calls == [large]
    finally:
        hooks.remove()


def test_module_counts_remembered_stay_bounded(monkeypatch) -> None:
    """A script that builds a new top-level module every step: the counts kept by id stay bounded."""
    from advisor.agent import forward_hooks

    monkeypatch.setattr(forward_hooks, "MAX_SIZES", 8)
    hooks = ForwardHooks(lambda m, a: None, lambda m, a, o: None)
    kept = []
    for _ in range(50):
        module = nn.Sequential(nn.ReLU())
        kept.append(module)  # alive: ids not reused
        hooks.lift(module)
    assert len(hooks._sizes) <= 8
