"""A multi-model script's recommendations name modules after their model (``netD.main.2``, where
the script has ``netG`` and ``netD``, both with a ``main.2``): the executor resolves them against
the models the agent captured, and the remedy lands on the named model's module."""

from __future__ import annotations

import pytest
import torch
from recommendations import recommendation
from torch import nn

from advisor.agent.agent import Agent
from advisor.agent.hooks import install
from advisor.apply.executor import Executor
from advisor.apply.model_names import resolve_model_names
from advisor.apply.target import Target
from advisor.records.commands import ApplyCommand
from advisor.records.settings import AgentSettings


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.ReLU(), nn.Linear(8, 6))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


def test_a_prefixed_name_is_applied_to_that_models_module() -> None:
    emitted: list = []
    # Step times here are noise: a huge margin keeps the keep/revert verdict out of this test.
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=(), apply_time_margin=1e9))
    hooks = install(agent)
    try:
        torch.manual_seed(0)
        netG, netD = Generator(), Discriminator()
        optG = torch.optim.SGD(netG.parameters(), lr=0.01)
        optD = torch.optim.SGD(netD.parameters(), lr=0.01)
        ex = agent.executor = Executor(agent.context)
        for step in range(6):
            if step == 1:
                ex.submit(ApplyCommand(recommendation=recommendation("ckpt", params={"modules": ["netD.main.2"]}),
                                       at_step=2, measure_steps=1))
            optD.zero_grad()
            netD(torch.randn(3, 6)).mean().backward()
            optD.step()
            optG.zero_grad()
            netD(netG(torch.randn(3, 4))).mean().backward()
            optG.step()
        labels = agent.objects.model_labels()
    finally:
        hooks.remove()
    assert sorted(labels) == ["netD", "netG"]
    assert [(r.status, r.error) for r in ex.results] == [("kept", None)]
    assert ex.results[0].params == {"modules": ["netD.main.2"]}  # reported as the user saw it
    assert "forward" in vars(netD.main[2])  # checkpointed: its forward replaced on the instance
    assert "forward" not in vars(netG.main[2])


def _two() -> Target:
    return Target(wrapped_models=[Generator(), Discriminator()], model_labels=["netG", "netD"])


def test_names_are_made_relative_and_the_named_model_goes_first() -> None:
    target = _two()
    resolved, params = resolve_model_names(target, {"modules": ["netD.main.2", "netD"], "min_bytes": 4})
    assert params == {"modules": ["main.2", ""], "min_bytes": 4}
    assert resolved.model_labels == ["netD", "netG"] and resolved.wrapped_models[0] is target.wrapped_models[1]
    _, stages = resolve_model_names(target, {"stages": [["netG.main.0"], ["netG.main.3"]]})
    assert stages == {"stages": [["main.0"], ["main.3"]]}


def test_what_is_not_a_prefixed_name_is_left_alone() -> None:
    target = _two()
    for params in ({"modules": ["main.2"]}, {"modules": ["netD.main.9"]}, {"dtype": "bf16"}):
        resolved, out = resolve_model_names(target, params)
        assert out == params and resolved is target
    one = Target(wrapped_models=[Generator()], model_labels=["netG"])
    assert resolve_model_names(one, {"modules": ["netG.main.0"]})[1] == {"modules": ["netG.main.0"]}


def test_names_from_two_models_in_one_remedy_are_refused() -> None:
    with pytest.raises(ValueError, match="one remedy acts on one model"):
        resolve_model_names(_two(), {"modules": ["netD.main.2"], "checkpoint": ["netG.main.0"]})
