"""A plan's environment: parsed and written by ``advisor.records.plan``, set by ``advisor attach
--plan`` in the training process (expandable allocator segments are read at start-up)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.planning import _plan_env
from advisor.records.plan import PLAN_VERSION, Plan, PlanEntry, PlanError, parse_plan, read_plan, save_plan

ROOT = Path(__file__).resolve().parents[1]
ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_env_round_trips_and_is_optional(tmp_path) -> None:
    plan = Plan(remedies=(PlanEntry(remedy="expandable_segments"),), env=dict(ENV))
    save_plan(plan, tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["env"] == ENV
    assert read_plan(tmp_path / "p.json") == plan
    assert "env" not in Plan().to_dict()  # plans without one are written as before
    assert parse_plan({"version": PLAN_VERSION, "remedies": []}).env == {}


@pytest.mark.parametrize("env", [["A=1"], {"A": 1}, {"": "x"}, {"A=B": "x"}])
def test_bad_env_is_refused(env) -> None:
    with pytest.raises(PlanError, match="'env' must be"):
        parse_plan({"version": PLAN_VERSION, "remedies": [], "env": env})


def test_the_restart_remedy_names_its_environment() -> None:
    assert _plan_env("expandable_segments") == ENV
    assert _plan_env("fused_optimizer") == {}


def run_plan(tmp_path, plan: dict) -> dict:
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--plan", str(tmp_path / "plan.json"),
                          "--steps", "2", "--json", str(out), "examples/slow_input.py", "--steps", "2",
                          "--load-ms", "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    [applied] = json.loads(out.read_text())["applied"]
    return applied


@pytest.mark.slow
def test_attach_plan_sets_the_environment_of_the_training_process(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    entry = [{"remedy": "expandable_segments", "params": {}}]
    ok = run_plan(tmp_path, {"version": PLAN_VERSION, "remedies": entry, "env": ENV})
    assert ok["status"] == "kept"
    missing = run_plan(tmp_path, {"version": PLAN_VERSION, "remedies": entry})  # the applier checks it
    assert missing["status"] == "failed" and "expandable_segments:True" in missing["error"]
