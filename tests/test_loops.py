"""Training loops as people write them, run in-process under the agent (issue 21).

Each script in tests/scripts prints ``step N loss X``; the agent must find one step per
iteration of the loop, the objective the step applied as its loss, the models the script
trains (and only those) under the names the script gives them.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
import time
from pathlib import Path

import pytest
import torch

from advisor.agent.agent import Agent, StopTraining
from advisor.agent.hooks import install
from advisor.probes.probe import Probe
from advisor.records.samples import Event, ModelInfo, OptimizerInfo, StepSample
from advisor.records.settings import AgentSettings
from fakes import Emitted

SCRIPTS = Path(__file__).resolve().parent / "scripts"


class Run:
    def __init__(self, agent: Agent, emitted: list, stdout: str, globals_: dict | None, stopped: bool) -> None:
        self.agent, self.emitted, self.stdout, self.globals, self.stopped = agent, emitted, stdout, globals_, stopped

    @property
    def steps(self) -> list[StepSample]:
        return [r for r in self.emitted if isinstance(r, StepSample)]

    def printed(self, prefix: str = "step") -> list[float]:
        return [float(line.split()[-1]) for line in self.stdout.splitlines() if line.startswith(prefix + " ")]

    def events(self, name: str) -> list[Event]:
        return [r for r in self.emitted if isinstance(r, Event) and r.name == name]

    def models(self) -> list[ModelInfo]:
        return [r for r in self.emitted if isinstance(r, ModelInfo)]


def run_script(name: str, *argv: str, probes: list[Probe] | None = None, **config) -> Run:
    """Run tests/scripts/NAME as ``python NAME ARGV`` would, with the agent's hooks installed."""
    path = str(SCRIPTS / name)
    emitted = Emitted()
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=(), **config), probes=probes or [])
    hooks = install(agent)
    saved_argv, out = sys.argv, io.StringIO()
    sys.argv = [path, *argv]
    globals_, stopped = None, False
    try:
        with contextlib.redirect_stdout(out):
            try:
                globals_ = runpy.run_path(path, run_name="__main__")
            except StopTraining:
                stopped = True
    finally:
        sys.argv = saved_argv
        hooks.remove()
        agent.close()
    return Run(agent, emitted, out.getvalue(), globals_, stopped)


def test_accumulation_loop_records_the_summed_objective_and_each_micro_batch():
    run = run_script("accumulate_gpt.py", "--steps", "3")
    assert [s.index for s in run.steps] == [0, 1, 2]
    assert [s.micro_batches for s in run.steps] == [4, 4, 4]
    # The script logs the sum of its four loss/4 terms, the objective its AdamW step applied.
    assert [s.loss for s in run.steps] == run.printed()
    assert all(len(s.losses) == 4 and sum(s.losses) == s.loss for s in run.steps)
    assert [(m.name, m.label) for m in run.models()] == [("TinyGPT", "model")]
    assert {s.boundary for s in run.steps} == {"optimizer"}


@pytest.mark.parametrize("update, boundary", [((), "zero_grad"), (("--no-grad-update",), "update")])
def test_hand_written_sgd_without_optimizer_has_steps(update, boundary):
    run = run_script("hand_sgd.py", "--steps", "5", *update)
    assert [s.index for s in run.steps] == [0, 1, 2, 3, 4]
    assert [s.loss for s in run.steps] == run.printed()
    assert [e.data["kind"] for e in run.events("step_boundary")] == [boundary]
    assert [s.boundary for s in run.steps] == [boundary] * 4 + ["exit"]  # the last ends at its backward
    # NLLLoss has nothing to train: the LSTM language model is the only model.
    assert [m.name for m in run.models()] == ["RNNModel"]
    assert run.printed("test")  # the test pass after the loop ran


def test_hand_written_sgd_stops_after_steps():
    run = run_script("hand_sgd.py", "--steps", "6", max_steps=2)
    assert run.stopped and run.printed() == [s.loss for s in run.steps] and len(run.steps) == 2


def test_gan_step_is_one_pass_over_both_optimizers_with_per_model_names():
    run = run_script("gan.py", "--steps", "4")
    assert [s.index for s in run.steps] == [0, 1, 2, 3]
    assert [s.micro_batches for s in run.steps] == [3, 3, 3, 3]
    assert [s.loss for s in run.steps] == run.printed()  # errD_real + errD_fake + errG
    labels = [o.label for o in run.emitted if isinstance(o, OptimizerInfo)]
    assert labels == ["Adam", "Adam_1"]
    assert all(set(s.optimizer_s) == {"Adam", "Adam_1"} and min(s.optimizer_s.values()) > 0 for s in run.steps)
    assert sorted((m.label, m.label_source) for m in run.models()) == [("netD", "global"), ("netG", "global")]
    g, d = run.globals["netG"], run.globals["netD"]
    assert run.agent.objects.module_name(g.main[3]) == "netG.main.3"
    assert run.agent.objects.module_name(d.main[3]) == "netD.main.3"
    assert run.agent.objects.module_name(d) == "netD"


def test_gan_stops_after_the_last_optimizer_of_the_last_step():
    run = run_script("gan.py", "--steps", "5", max_steps=2)
    assert run.stopped and len(run.steps) == 2
    assert run.printed() == [s.loss for s in run.steps]  # the generator update of step 1 ran


def test_lbfgs_closure_forward_is_forward_and_loss_is_the_first_evaluation():
    run = run_script("lbfgs_rnn.py", "--steps", "3")
    assert [s.index for s in run.steps] == [0, 1, 2]
    assert [s.loss for s in run.steps] == run.printed()
    for s in run.steps:
        assert s.micro_batches > 1 and len(s.losses) == s.micro_batches  # LBFGS evaluated several times
        assert s.phases["forward_s"] > 0 and s.phases["backward_s"] > 0
        assert sum(s.phases.values()) == pytest.approx(s.time_s, rel=1e-9)
    assert [m.name for m in run.models()] == ["Sequence"]  # not the MSELoss


def test_python_loop_rnn():
    run = run_script("python_rnn.py", "--steps", "3")
    assert [s.loss for s in run.steps] == run.printed()
    assert [m.label for m in run.models()] == ["model"]


def test_eval_pass_inside_the_step_is_eval_time_and_final_test_pass_runs():
    run = run_script("eval_in_step.py", "--steps", "6", max_steps=6)
    assert [s.index for s in run.steps] == list(range(6))
    assert [s.loss for s in run.steps] == run.printed()
    # Evaluation runs after the optimizer steps of steps 1 and 3: in the periods of steps 2 and 4.
    assert [s.eval_s > 0 for s in run.steps] == [False, False, True, False, True, False]
    for s in run.steps:
        assert sum(s.phases.values()) == pytest.approx(s.time_s, rel=1e-9)
    assert len(run.printed("test")) == 1  # --steps equal to the loop's length cuts nothing


def test_optimizer_built_but_never_stepped_and_a_replaced_optimizer():
    emitted = Emitted()
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=()))
    hooks = install(agent)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        spare = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)  # built, never stepped
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses, replaced = [], []
        for i in range(6):
            if i == 3:  # a remedy builds a new optimizer over the same parameters, keeps the old
                replaced.append(opt)
                opt = torch.optim.Adam(model.parameters(), lr=0.01)
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        agent.flush(sync=True)
    finally:
        hooks.remove()
    del spare
    steps = [r for r in emitted if isinstance(r, StepSample)]
    assert [s.index for s in steps] == [0, 1, 2, 3, 4, 5]
    assert [s.loss for s in steps] == losses
    assert all(s.micro_batches == 1 for s in steps)


def test_reloaded_copies_and_loss_modules_are_not_models():
    emitted = Emitted()
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=()))
    hooks = install(agent)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        criterion = torch.nn.MSELoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            loss = criterion(model(torch.randn(4, 8)), torch.zeros(4, 1))
            loss.backward()
            opt.step()
            opt.zero_grad()
        copy = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        copy.load_state_dict(model.state_dict())
        with torch.no_grad():
            copy(torch.randn(4, 8))
    finally:
        hooks.remove()
    assert agent.objects.models() == [model]
    assert [m.label for m in emitted if isinstance(m, ModelInfo)] == ["model"]
    assert agent.objects.module_name(model[2]) == "2"  # one model: names are not prefixed


class _SlowDeep(Probe):
    """A deep probe that costs 0.1 s at every phase change of a deep step."""

    name = "slow-deep"

    def __init__(self) -> None:
        self.deep = False

    def start_deep(self, ctx, step):
        self.deep = True

    def stop_deep(self, ctx, step):
        self.deep = False

    def on_phase(self, ctx, phase, now):
        if self.deep:
            time.sleep(0.1)


def test_a_deep_step_far_slower_than_light_steps_ends_deep_sampling():
    emitted = Emitted()
    agent = Agent(emit=emitted.append, probes=[_SlowDeep()],
                  settings=AgentSettings(deep_steps=(2, 3, 4), deep_max_slowdown=2.0, deep_min_s=0.05))
    hooks = install(agent)
    try:
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        agent.flush(sync=True)
    finally:
        hooks.remove()
    steps = [r for r in emitted if isinstance(r, StepSample)]
    assert [s.deep for s in steps] == [False, False, True, False, False, False]
    stopped = [r for r in emitted if isinstance(r, Event) and r.name == "deep_sampling_stopped"]
    assert len(stopped) == 1 and stopped[0].data["step"] == 2
    assert any(r.name == "warning" and "no more scheduled deep steps" in r.data["message"]
               for r in emitted if isinstance(r, Event))


def test_a_run_without_deep_step_says_nothing_was_measured_deeply():
    run = run_script("python_rnn.py", "--steps", "3", probes=[_SlowDeep()], max_steps=1)
    assert len(run.steps) == 1
    assert any("no step was deep-sampled" in e.data["message"] for e in run.events("warning"))


def test_a_ctrl_c_swallowed_in_a_finalizer_is_raised_at_the_next_hook():
    agent = Agent(emit=lambda r: None, settings=AgentSettings(deep_steps=()))
    hooks = install(agent)
    try:
        class Finalized:
            def __del__(self):
                raise KeyboardInterrupt  # what SIGINT does when it lands in a storage finalizer

        Finalized()  # Python ignores the exception here (sys.unraisablehook)
        model = torch.nn.Linear(2, 1)
        with pytest.raises(KeyboardInterrupt):
            model(torch.randn(1, 2))
        model(torch.randn(1, 2))  # raised once: a script that catches Ctrl-C goes on
    finally:
        hooks.remove()


def test_a_run_that_fails_before_its_first_optimizer_step_records_no_step():
    """An OOM in step 0's backward: the optimizer never stepped, so no step ended."""
    emitted = Emitted()
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=()))
    hooks = install(agent)
    try:
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 8)).sum().backward()
    finally:
        hooks.remove()
        agent.close()
    assert opt is not None and not [r for r in emitted if isinstance(r, StepSample)]
