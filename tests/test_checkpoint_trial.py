"""What checkpointing a block costs, measured on a copy of it between steps (issue 30: the zoo's
hf_clm kept checkpointing at +28% over its predicted step time, priced at one more forward per
block where the checkpoint's machinery costs as much again)."""

from __future__ import annotations

import contextlib
import weakref

import pytest
import torch
from profiles import records_profile

from advisor.agent.agent import Agent
from advisor.agent.checkpoint_trial import CheckpointTrials, run_trial
from advisor.agent.hooks import install
from advisor.recommend.memory_model import added_step_time, recompute_seconds
from advisor.records.events import CheckpointTrial, DataLoaderSettings
from advisor.records.samples import Event, StepSample
from advisor.records.settings import AgentSettings
from fakes import Emitted


class Chatty(torch.nn.Module):
    """Many small saved ops: the checkpoint's per-save machinery outweighs the arithmetic."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 8))
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        for _ in range(12):
            x = torch.tanh(x * self.w)
        return self.drop(x) * scale


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Chatty() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, scale=0.5)
        return x


def test_the_trial_measures_more_than_one_forward_and_leaves_the_job_as_it_was() -> None:
    torch.manual_seed(0)
    net = Net()
    modules = {id(m): (f"blocks.{i}", weakref.ref(m)) for i, m in enumerate(net.blocks)}
    trials = CheckpointTrials()
    trials.start(modules)
    net(torch.randn(4, 8).requires_grad_()).sum().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    rng = torch.get_rng_state()
    [(kind, figures)] = trials.finish(contextlib.nullcontext, None).items()
    assert kind == "Chatty" and figures["module"] == "blocks.0"  # one per type, the first
    # a checkpoint of it adds more than the one forward the recompute span priced
    assert figures["checkpoint_s"] > figures["plain_s"] + figures["forward_s"]
    assert figures["ratio"] == pytest.approx((figures["checkpoint_s"] - figures["plain_s"]) / figures["forward_s"])
    assert torch.equal(torch.get_rng_state(), rng)  # the script's random stream is untouched
    assert all(torch.equal(p.grad, g) for p, g in zip(net.parameters(), grads))  # a copy was run
    assert not net.blocks[0]._forward_pre_hooks_with_kwargs  # the capture's hook is gone
    trials.start(modules)
    net(torch.randn(4, 8)).sum().backward()
    assert trials.finish(contextlib.nullcontext, None) == {}  # each type is tried once


def test_a_sharded_or_subclass_parameter_is_not_copied() -> None:
    from advisor.agent.checkpoint_trial import representatives

    block = Chatty()
    assert set(representatives({id(block): ("b.0", weakref.ref(block))}, set())) == {"Chatty"}

    class Sub(torch.Tensor):
        pass

    odd = Chatty()
    odd.w = torch.nn.Parameter(torch.randn(4, 8).as_subclass(Sub))
    assert representatives({id(odd): ("b.0", weakref.ref(odd))}, set()) == {}


def test_a_block_with_nothing_to_differentiate_gives_no_figure() -> None:
    frozen = Chatty().requires_grad_(False)
    assert run_trial(frozen, (torch.randn(4, 8),), {}, None, None) is None


def _train(settings: AgentSettings | None, steps: int = 8) -> tuple[list[float], list]:
    emitted = Emitted()
    torch.manual_seed(1)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    agent = Agent(emit=emitted.append, settings=settings) if settings is not None else None
    hooks = install(agent) if agent is not None else None
    losses = []
    try:
        for _ in range(steps):
            loss = net(torch.randn(4, 8)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        if agent is not None:
            agent.flush(sync=True)
    finally:
        if hooks is not None:
            hooks.remove()
    return losses, emitted


def test_under_a_memory_budget_the_agent_tries_a_block_at_the_timed_step_and_losses_hold() -> None:
    bare, _ = _train(None)
    losses, emitted = _train(AgentSettings(memory_budget_bytes=1 << 40, deep_steps=(1, 2, 3), probes=("memory",)))
    assert losses == bare  # bit for bit: the trial ran on a copy under the RNG's fork
    trials = [r for r in emitted if isinstance(r, Event) and r.name == "checkpoint_trial"]
    assert [t.step for t in trials] == [5]  # the timed light step (step 4 follows the deep ones)
    assert set(trials[0].data["modules"]) == {"Chatty"}
    steps = [r for r in emitted if isinstance(r, StepSample)]
    assert [s.index for s in steps] == list(range(8))
    assert all(s.micro_batches == 1 for s in steps)  # the copy's backward was not the job's
    _, without = _train(AgentSettings(deep_steps=(1, 2, 3), probes=("memory",)))
    assert not any(isinstance(r, Event) and r.name == "checkpoint_trial" for r in without)  # no budget: no trial


def test_the_recommender_prices_a_checkpoint_from_the_trial_of_its_type() -> None:
    """The trial's added seconds, in proportion to each same-type module's forward over the one
    tried (a timed step's forward holds the timer's hooks: both do); the ratio where the module
    tried has no figure; the recompute span where no trial ran."""
    tried = {"name": "blocks.0", "type": "Chatty", "depth": 2, "activation_bytes": 10}
    other = {"name": "blocks.1", "type": "Chatty", "depth": 2, "activation_bytes": 10}
    trial = Event(name="checkpoint_trial", step=5, data=CheckpointTrial(modules={"Chatty": {
        "module": "blocks.0", "forward_s": 0.001, "plain_s": 0.002, "checkpoint_s": 0.005, "ratio": 3.0}}).to_dict())
    steps = [StepSample(index=i, time_s=0.01, phases={"forward_s": 0.004},
                        module_forward_s={"blocks.0": 0.002, "blocks.1": 0.004} if i == 5 else {},
                        module_recompute_s={"blocks.1": 0.0015} if i == 5 else {}) for i in range(4, 8)]
    priced = records_profile(steps=steps, events=[trial], modules=[tried, other])
    assert priced.checkpoint_ratio == {"Chatty": 3.0}
    assert priced.checkpoint_added == {"Chatty": ("blocks.0", pytest.approx(0.003))}
    # 3 ms added to blocks.0; blocks.1's forward is twice blocks.0's
    assert recompute_seconds(priced, priced.module("blocks.1")) == pytest.approx(0.006)
    alone = records_profile(steps=steps, events=[trial], modules=[other])
    assert recompute_seconds(alone, alone.module("blocks.1")) == pytest.approx(3.0 * 0.004)
    untried = records_profile(steps=steps, modules=[other])
    assert recompute_seconds(untried, untried.module("blocks.1")) == pytest.approx(0.0015)  # the span


def test_added_compute_fills_the_data_wait_of_a_loader_with_workers() -> None:
    """minGPT's adder, two workers: 1.6-4 ms of data wait a step absorbed checkpointing's 3.6 ms
    of backward but 0.5 ms; in the main process (no workers) the wait is the loader's own work."""
    steps = [StepSample(index=i, time_s=0.013, phases={"data_s": 0.002}) for i in range(4, 8)]
    for workers, added in ((2, 0.001), (0, 0.003)):
        loader = Event(name="dataloader", step=1, data=DataLoaderSettings(num_workers=workers).to_dict())
        assert added_step_time(records_profile(steps=steps, events=[loader]), 0.003) == pytest.approx(added)
