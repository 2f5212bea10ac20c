"""ZeRO refused where the script's own checkpoints would become partial (issue 11).

The agent watches ``torch.save`` and torch.distributed.checkpoint's savers
(``advisor/agent/saves.py``) and reports each kind of save of captured state once; the ZeRO
predictor refuses the stages that would make it partial (``recommend/remedies/zero.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from advisor.agent.agent import Agent
from advisor.agent.hooks import install
from advisor.agent.saves import contents
from advisor.intake import RecordError, parse_record
from advisor.records.samples import Event
from advisor.records.settings import AgentSettings

ROOT = Path(__file__).resolve().parents[1]


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt


def test_contents_names_what_of_the_captured_state_an_object_holds() -> None:
    model, opt = _trained()
    assert contents(model.state_dict(), [model], [opt], statefuls=False)[0] == ["model"]
    assert contents({"optim": opt.state_dict(), "step": 3}, [model], [opt], statefuls=False)[0] == ["optimizer"]
    both = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    assert contents(both, [model], [opt], statefuls=False)[:2] == (["model", "optimizer"], False)
    # A copy of the weights, a loss history and an unrelated module's state are not the job's state.
    other = torch.nn.Linear(8, 8)
    unrelated = {"w": model[0].weight.detach().clone(), "losses": torch.randn(10), "other": other.state_dict()}
    assert contents(unrelated, [model], [opt], statefuls=False)[0] == []
    # An optimizer's state dict is recognised by its shape even before the first step (no state).
    fresh = torch.optim.SGD(other.parameters(), lr=0.1)
    assert contents(fresh.state_dict(), [model], [fresh], statefuls=False)[0] == ["optimizer"]

    class AppState:  # the DCP tutorials' Stateful holding the model and the optimizer
        def __init__(self) -> None:
            self.model, self.optimizer = model, opt

        def state_dict(self) -> dict:
            return {}

    assert contents({"app": AppState()}, [model], [opt], statefuls=True)[0] == ["model", "optimizer"]
    assert contents({"app": AppState()}, [model], [opt], statefuls=False)[0] == []  # torch.save pickles it whole


def _events(run) -> list[Event]:
    emitted: list = []
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=()))
    hooks = install(agent)
    try:
        run()
    finally:
        hooks.remove()
    return [r for r in emitted if isinstance(r, Event) and r.name == "checkpoint_save"]


def test_the_agent_reports_each_kind_of_save_of_the_job_state_once(tmp_path: Path) -> None:
    def run() -> None:
        model, opt = _trained()
        for i in range(3):
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / f"c{i}.pt")
        torch.save(model.state_dict(), tmp_path / "model.pt")
        torch.save(torch.randn(3), tmp_path / "noise.pt")

    events = _events(run)
    assert [(e.data["api"], e.data["saves"], e.data["sharded"]) for e in events] == [
        ("torch.save", ["model", "optimizer"], False), ("torch.save", ["model"], False)]
    assert torch.save.__module__ == "torch.serialization"  # the wrapper is gone with the hooks
    assert set(torch.load(tmp_path / "c2.pt", weights_only=True)) == {"model", "optimizer"}  # saved as written


def test_a_distributed_checkpoint_save_is_seen_through_the_package_name(tmp_path: Path) -> None:
    def run() -> None:
        import torch.distributed.checkpoint as dcp

        model, opt = _trained()
        dcp.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint_id=str(tmp_path / "dcp"))

    with pytest.warns(UserWarning, match="single process"):  # no process group: DCP saves alone
        events = _events(run)
    assert [(e.data["api"], e.data["saves"]) for e in events] == [("dcp.save", ["model", "optimizer"])]
    assert (tmp_path / "dcp" / ".metadata").exists()


def test_intake_takes_only_the_named_apis_and_state_kinds() -> None:
    good = {"api": "dcp.save", "saves": ["optimizer"], "sharded": False, "step": 3}
    assert parse_record("event", {"rank": 0, "name": "checkpoint_save", "data": good}).data == good
    for bad in ({**good, "api": "pickle.dump"}, {**good, "saves": ["weights"]}):
        with pytest.raises(RecordError, match="checkpoint_save"):
            parse_record("event", {"rank": 0, "name": "checkpoint_save", "data": bad})


def _profile(*saves: dict):
    from advisor.recommend.profile import ModuleProfile, Profile
    from advisor.records.events import CheckpointSave

    modules = (ModuleProfile(name="", parameter_bytes=400),
               *(ModuleProfile(name=f"layers.{i}", parameter_bytes=90) for i in range(4)))
    return Profile(peak_bytes=1800, budget_bytes=1000, step_time_s=1.0, world_size=2,
                   data_parallel="DistributedDataParallel", optimizer_count=1, modules=modules,
                   categories_at_peak={"parameter": 400, "gradient": 400, "optimizer_state": 800, "activation": 200},
                   checkpoint_saves=tuple(CheckpointSave.from_dict({"sharded": False, "step": 6, **s}) for s in saves))


@pytest.mark.parametrize(("saves", "proposed"), [
    ((), [1, 2, 3]),
    (({"api": "torch.save", "saves": ["model", "optimizer"]},), []),
    (({"api": "torch.save", "saves": ["model"]},), [1]),
    (({"api": "dcp.save", "saves": ["model", "optimizer"]},), [2, 3]),
    (({"api": "dcp.async_save", "saves": ["model"]},), [1, 2, 3]),
    (({"api": "dcp.save", "saves": ["optimizer"]}, {"api": "torch.save", "saves": ["model"]}), []),
])
def test_each_kind_of_save_refuses_the_stages_it_would_make_partial(saves, proposed) -> None:
    from advisor.recommend.finding import Finding
    from advisor.recommend.remedies.zero import propose

    memory = Finding(rule="memory", bottleneck="memory", summary="over budget", severity=1.0, budget_bytes=1700)
    proposal = propose(_profile(*saves), memory)  # every stage fits: the lowest allowed one is proposed
    recs, evidence = proposal.recommendations, proposal.evidence
    assert [r.params["stage"] for r in recs] == proposed[:1]
    assert [e.what for e in evidence if e.what.endswith("predicted")] == [f"ZeRO-{k} predicted" for k in proposed]
    refused = [e.value for e in evidence if str(e.value).startswith("not proposed")]
    assert len(refused) == (3 - len(proposed) if proposed else 1)  # refused whole: one reason
    assert all("first seen at step 6 on rank 0" in v for v in refused)
    for rec in recs:  # an allowed save is named in the evidence, with why it stays whole
        assert any("the script saves" in str(e) for e in rec.evidence) == bool(saves)
        assert any("watches torch.save" in p for p in rec.prerequisites) == (not saves)


def test_a_torch_save_of_the_optimizer_refuses_the_whole_remedy_with_the_reason() -> None:
    from advisor.recommend.advise import advise
    from advisor.recommend.remedies.zero import refusal

    profile = _profile({"api": "torch.save", "saves": ["optimizer"]})
    reason = refusal(profile)
    assert reason and "torch.save" in reason and "partial" in reason
    diagnosis, recs = advise(profile)
    assert diagnosis.bottleneck == "memory" and not [r for r in recs if r.remedy == "zero"]
    assert any(e.what == "ZeRO" and reason in str(e.value) for e in diagnosis.evidence)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(("save", "stages"), [("torch", set()), ("dcp", {2, 3}), ("none", {1, 2, 3})])
def test_attach_refuses_the_stages_that_would_make_the_scripts_checkpoint_partial(tmp_path, save, stages):
    """tests/scripts/ddp_save.py on 2 gloo ranks, under a budget nothing fits (so the stage with
    the lowest peak among those allowed is proposed): the script that saves with torch.save on
    rank 0 gets no ZeRO and the reason; the one that saves with DCP from every rank gets no
    ZeRO-1; the control may get any stage."""
    env = dict(os.environ, ADVISOR_HOME=str(tmp_path), OMP_NUM_THREADS="1")
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--nproc-per-node", "2",
                           "--json", str(out), "--memory-budget", "1B", "tests/scripts/ddp_save.py",
                           "--save", save, "--save-every", "3", "--steps", "8"],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    zero = [r["params"]["stage"] for r in report["recommendations"] if r["remedy"] == "zero"]
    assert len(zero) == (1 if stages else 0) and set(zero) <= stages
    evidence = json.dumps(report["diagnosis"]["evidence"])
    assert ("saves its optimizer's state_dict() with torch.save" in evidence) == (save == "torch")
    assert ("ZeRO-1 would" in evidence or "under ZeRO-1 each rank" in evidence) == (save == "dcp")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_save_first_seen_under_zero_is_warned_about_and_ends_the_proposal(tmp_path):
    """ZeRO-2 applied at step 5, before the script's first save (step 7): the save is warned
    about (rank 0's checkpoint is partial), and the advice after it proposes no ZeRO."""
    env = dict(os.environ, ADVISOR_HOME=str(tmp_path), OMP_NUM_THREADS="1")
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--nproc-per-node", "2",
                           "--json", str(out), "--memory-budget", "1B", "--apply", "zero-2", "--apply-at-step", "5",
                           "tests/scripts/ddp_save.py", "--save", "torch", "--save-every", "8", "--steps", "12"],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert sorted(a["rank"] for a in report["applied"] if a["remedy"] == "zero") == [0, 1]
    [warning] = [w for w in report["warnings"] if "torch.save" in w]
    assert "while ZeRO-2 is in force" in warning and "optimizer.state_dict()" in warning
    assert not [r for r in report["recommendations"] if r["remedy"] == "zero"]
