"""Every remedy answers, in the training process and before it is offered, whether it can apply to
this job (``check_<name>`` beside ``apply_<name>``, issue 30 item 4): what it refuses is listed as
not applicable with the reason, last, never chosen by ``--apply auto`` and refused by an apply."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from profiles import records_profile
from recommendations import recommendation
from test_recommend_advise import MIB, gpt_report

from advisor.advice import AdviceLoop
from advisor.apply import registry
from advisor.apply.target import Target
from advisor.recommend.advise import advise
from advisor.records.events import RemedyChecks
from advisor.regime import apply_refusal
from advisor.state import SessionState

ROOT = Path(__file__).resolve().parents[1]


class _Tied(torch.nn.Module):
    """A GPT's shape in small: the embedding shared with the head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


def test_the_checks_refuse_what_cannot_apply_to_a_cpu_job() -> None:
    model = torch.nn.Linear(4, 4)
    lbfgs = Target.of(model, [torch.optim.LBFGS(model.parameters())])
    answers = registry.checks(lbfgs)
    assert "host memory already" in answers["optimizer_offload"][""]
    assert "host memory already" in answers["activation_offload"][""]
    assert answers["fused_optimizer"] == {"": "LBFGS has no fused implementation"}
    assert answers["compile_blocks"] == {}
    assert registry.checks(Target.of(model, [torch.optim.Adam(model.parameters())]))["fused_optimizer"] == {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        compiled = torch.compile(model, backend="eager")
    assert "compiled already" in registry.checks(Target.of(compiled))["compile_blocks"][""]


def test_zero_2_and_3_are_refused_for_tied_weights_and_zero_1_is_not(tmp_path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(_Tied())
        target = Target(wrapped_models=[ddp], optimizers=[torch.optim.Adam(ddp.parameters())], wrappers=[ddp])
        refusals = RemedyChecks(checks=registry.checks(target))
        assert "tied weights" in (refusals.refusal("zero", {"stage": 2}) or "")
        assert "tied weights" in (refusals.refusal("zero", {"stage": 3}) or "")
        assert refusals.refusal("zero", {"stage": 1}) is None
        untied = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        plain = Target(wrapped_models=[untied], optimizers=[torch.optim.Adam(untied.parameters())], wrappers=[untied])
        assert registry.checks(plain)["zero"] == {}
    finally:
        dist.destroy_process_group()


def test_a_refused_remedy_is_listed_last_with_its_reason_and_never_chosen_or_applied() -> None:
    profile = records_profile(**gpt_report(params=2000 * MIB))
    _, recs = advise(profile)
    assert recs[0].remedy == "optimizer_offload" and recs[0].applicable  # no checks recorded: offered
    refused = replace(profile, remedy_checks=(RemedyChecks(checks={"optimizer_offload": {"": "host memory"}}),))
    _, recs = advise(refused)
    offload = [r for r in recs if r.remedy == "optimizer_offload"]
    assert offload and not offload[0].applicable and offload[0].why == "host memory"
    first_refused = next(i for i, r in enumerate(recs) if not r.applicable)
    assert all(r.applicable for r in recs[:first_refused]) and not any(r.applicable for r in recs[first_refused:])
    assert offload[0].to_dict()["applicable"] is False and offload[0].to_dict()["why"] == "host memory"
    assert AdviceLoop._choose([offload[0]], "auto") is None
    assert AdviceLoop._choose([offload[0]], offload[0].id) is None  # a named one too: it cannot apply
    assert "cannot apply to this job: host memory" in (apply_refusal(SessionState(), offload[0]) or "")
    from advisor.advice import auto_nothing_reason

    said = auto_nothing_reason([offload[0]], allow_inexact=False)
    assert "optimizer-offload cannot apply to this job (host memory)" in said and "--plan" not in said


def test_a_refused_remedy_does_not_fit_its_finding_so_the_fallbacks_are_still_asked() -> None:
    from advisor.recommend.finding import Finding

    fits = recommendation("a", peak=10, budget_bytes=12)
    finding = Finding(rule="memory", bottleneck="memory", summary="", severity=1.0, budget_bytes=12,
                      recommendations=(replace(fits, applicable=False, why="no"),))
    assert not finding.fits
    assert replace(finding, recommendations=(fits,)).fits


@pytest.mark.slow
def test_a_cpu_job_is_not_offered_an_offload_under_attach(tmp_path) -> None:
    """examples/gpt.py on the CPU over a budget: the offloads are listed as not applicable, why said."""
    import json

    out = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ADVISOR_HOME": str(tmp_path / "home"), "COLUMNS": "400"}
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--json", str(out),
                          "--memory-budget", "600KiB", "--steps", "8", "examples/gpt.py", "--layers", "2",
                          "--hidden", "32", "--heads", "2", "--seq", "16", "--batch", "4", "--vocab", "64",
                          "--device", "cpu", "--steps", "8"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    recs = json.loads(out.read_text())["recommendations"]
    host = [r for r in recs if r["remedy"] in ("optimizer_offload", "activation_offload", "cpu_offload")]
    assert host and all(not r["applicable"] and "host memory already" in r["why"] for r in host)
    assert "not applicable" in run.stderr  # the text report says so beside the title


def test_a_joint_plan_is_refused_where_any_part_is() -> None:
    """A plan applies as one unit: a part the job refuses (ZeRO-3 on tied weights, an offload on a
    CPU-only job) makes the whole plan not applicable, with that part's reason."""
    from advisor.recommend.finding import _checked
    from test_joint_plan import _plan_rec

    profile = records_profile(**gpt_report(params=2000 * MIB))
    plan = _plan_rec()
    assert _checked(profile, plan).applicable
    tied = replace(profile, remedy_checks=(RemedyChecks(checks={"zero": {"stage=3": "tied weights"}}),))
    refused = _checked(tied, plan)
    assert not refused.applicable and refused.why == "tied weights"
    stage2 = replace(profile, remedy_checks=(RemedyChecks(checks={"zero": {"stage=2": "tied weights"}}),))
    assert _checked(stage2, plan).applicable  # the plan's stage is 3
