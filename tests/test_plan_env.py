"""A plan's environment: parsed and written by ``advisor.records.plan``, set by ``advisor attach
--plan`` in the training process (expandable allocator segments are read at start-up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.planning import _plan_env
from advisor.records.plan import PLAN_VERSION, Plan, PlanEntry, PlanError, parse_plan, read_plan, save_plan
from advisor.records.settings import AgentSettings
from advisor.controller import AttachOptions, Session

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


def run_plan(tmp_path, plan: dict, said: str | None = None) -> dict:
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--plan", str(tmp_path / "plan.json"),
                          "--steps", "2", "--json", str(out), "examples/slow_input.py", "--steps", "2",
                          "--load-ms", "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    if said is not None:  # what the plan sets is said before the job starts
        lines = run.stderr.splitlines()
        assert lines.index(said) < next(i for i, line in enumerate(lines) if line.startswith("advisor: session "))
    [applied] = json.loads(out.read_text())["applied"]
    return applied


@pytest.mark.slow
def test_attach_plan_sets_the_environment_of_the_training_process(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    entry = [{"remedy": "expandable_segments", "params": {}}]
    ok = run_plan(tmp_path, {"version": PLAN_VERSION, "remedies": entry, "env": ENV},
                  said="advisor: the plan sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the training "
                       "process's environment")
    assert ok["status"] == "kept"
    missing = run_plan(tmp_path, {"version": PLAN_VERSION, "remedies": entry})  # the applier checks it
    assert missing["status"] == "failed" and "expandable_segments:True" in missing["error"]


# -- plans cannot run code ----------------------------------------------------------------------
# A plan is a file people share. Its env used to be applied as it was: PYTHONPATH with a
# sitecustomize.py there ran that code in the training process, unseen; LD_PRELOAD, or the
# advisor's own ADVISOR_SOCKET / ADVISOR_CONFIG, would do as much.


@pytest.mark.parametrize("name, why", [
    ("PYTHONPATH", "load and run code"), ("LD_PRELOAD", "load and run code"), ("PYTHONSTARTUP", "load and run code"),
    ("ADVISOR_SOCKET", "the advisor's own"), ("ADVISOR_CONFIG", "the advisor's own"),
    ("NCCL_NET_PLUGIN", "names a file or a library"), ("NCCL_DEBUG_FILE", "names a file or a library"),
    ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "names a file or a library"), ("HOME", "not an allocator or library setting"),
])
def test_env_outside_the_allowlist_is_refused_with_the_reason(name, why) -> None:
    with pytest.raises(PlanError, match=rf"env '{name}' refused: .*{why}.*may set only .*PYTORCH_CUDA_ALLOC_CONF, NCCL_\*"):
        parse_plan({"version": PLAN_VERSION, "remedies": [], "env": {name: "x"}})


def test_allocator_and_library_settings_are_allowed() -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_ALGO": "Ring", "NCCL_SOCKET_IFNAME": "eth0",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4",
           "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert parse_plan({"version": PLAN_VERSION, "remedies": [], "env": env}).env == env


def test_a_pythonpath_plan_runs_nothing(tmp_path) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    marker = tmp_path / "ran"
    (hook / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": PLAN_VERSION, "remedies": [], "env": {"PYTHONPATH": str(hook)}}))
    home = tmp_path / "home"
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--plan", str(plan), "--steps", "1",
                          "examples/slow_input.py", "--steps", "1", "--load-ms", "0"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "ADVISOR_HOME": str(home)})
    assert run.returncode == 2, run.stderr[-3000:]
    assert "env 'PYTHONPATH' refused" in run.stderr and "Traceback" not in run.stderr
    assert not marker.exists()  # nothing ran
    assert not (home / "sessions").exists() or not any((home / "sessions").iterdir())  # nothing started


def test_the_training_environment_never_takes_what_a_plan_may_not_set(monkeypatch) -> None:
    """Whoever built the settings: the variables a plan may not set are left out, and the advisor's
    own always win."""
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    plan_env = {"PYTHONPATH": "/elsewhere", "ADVISOR_SOCKET": "/tmp/theirs.sock", "NCCL_ALGO": "Ring"}
    session = Session(AttachOptions(script="train.py", settings=AgentSettings(plan_env=plan_env)))
    try:
        env = session.environment()
    finally:
        session.close()
    assert env.get("PYTHONPATH") == os.environ.get("PYTHONPATH")
    assert env["ADVISOR_SOCKET"] == session.server.path and env["NCCL_ALGO"] == "Ring"
