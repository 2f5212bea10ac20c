"""``with advisor.session():`` around a loop in a plain ``python script.py`` (issue 35, item 1).

Each case runs tests/scripts/inprocess_loop.py in a process of its own (the agent's hooks, and
the profiler its probes run, stay out of pytest's process), in a fresh ``$ADVISOR_HOME``, and
once more bare (``--bare``: the same loop in a ``nullcontext``): the model and optimizers are
built before the block, as in a notebook, and two steps train after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "inprocess_loop.py"
GPT = ["--gpt", "--gpt-layers", "4", "--gpt-hidden", "64", "--batch", "8", "--probes", "memory"]


def _env(home: Path) -> dict[str, str]:
    # The script imports this tree's advisor, as a user's would import the installed one.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "ADVISOR_HOME": str(home), "PYTHONPATH": path, "OMP_NUM_THREADS": "1",
            "PYTHONHASHSEED": "0"}


def run(home: Path, *args: str, attach: bool = False) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), *args]
    if attach:
        command = [sys.executable, "-m", "advisor", "attach", "--headless", *command[1:]]
    done = subprocess.run(command, cwd=ROOT, env=_env(home), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def loss_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("step ")]


def report_latest(home: Path, tmp_path: Path) -> dict:
    out = tmp_path / "latest.json"
    done = subprocess.run([sys.executable, "-m", "advisor", "report", "latest", "--json", str(out)], cwd=ROOT,
                          env=_env(home), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def test_a_loop_in_a_session_records_every_step_and_prints_what_it_prints_bare(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bare = run(home, "--bare", "--steps", "8")
    session = run(home, "--steps", "8", "--result", str(tmp_path / "r.json"))
    assert session.stdout == bare.stdout  # every byte: losses, the steps after the block
    assert session.stdout.rstrip().endswith("hooks removed True")  # every hook and wrapper restored
    report = report_latest(home, tmp_path)  # what `advisor report latest` reads
    assert report["run"]["exit"]["code"] == 0
    assert [s["index"] for s in report["steps"]] == list(range(8))
    printed = [float(line.split()[3]) for line in loss_lines(bare.stdout)]
    assert [s["loss"] for s in report["steps"]] == printed  # bit for bit
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["id"] == report["session"]["id"] and result["exit_code"] == 0
    assert len(result["steps"]) == 8  # s.report() after the block: the saved final report
    assert "advisor: session" in session.stderr and report["session"]["id"] in session.stderr


@pytest.mark.slow
def test_two_optimizers_built_before_the_block_make_one_step(tmp_path: Path) -> None:
    """A GAN's critic and generator updates are one step: the optimizers, built before the block,
    are found when it opens, so the loop's period is right from the first step."""
    home = tmp_path / "home"
    session = run(home, "--gan", "--steps", "6")
    assert session.stdout == run(home, "--gan", "--steps", "6", "--bare").stdout
    report = report_latest(home, tmp_path)
    assert [s["index"] for s in report["steps"]] == list(range(6))
    assert all(sorted(s["optimizer_s"]) == ["Adam", "SGD"] for s in report["steps"]), report["steps"]
    assert sorted(o["name"] for o in report["run"]["optimizers"]) == ["Adam", "SGD"]


@pytest.mark.slow
def test_under_attach_the_session_adds_nothing_and_says_so(tmp_path: Path) -> None:
    home = tmp_path / "home"
    attached = run(home, "--steps", "5", attach=True)
    assert attached.stdout == run(home, "--bare", "--steps", "5").stdout
    assert "RuntimeWarning: advisor.session(): the advisor already records this process" in attached.stderr
    assert len(list((home / "sessions").iterdir())) == 1  # attach's own session only


@pytest.mark.slow
def test_advice_and_apply_from_inside_the_loop(tmp_path: Path) -> None:
    """At step 6 the loop asks its session for the live recommendations and applies one with
    ``s.apply``: under a budget of 70% of the measured peak, checkpointing the GPT's blocks. It
    lands at a later boundary, is measured and kept like any apply, and the losses stay the bare
    run's bit for bit (checkpointing is exact)."""
    home = tmp_path / "home"
    bare = [float(line.split()[3]) for line in loss_lines(run(home, *GPT, "--steps", "20", "--bare").stdout)]
    run(home, *GPT, "--steps", "4")
    peak = report_latest(home, tmp_path)["memory"]["peak_bytes"]
    result_path = tmp_path / "r.json"
    run(home, *GPT, "--steps", "20", "--budget", str(int(0.7 * peak)), "--apply-id", "checkpoint-blocks",
        "--apply-at", "6", "--result", str(result_path))
    result = json.loads(result_path.read_text())
    sent = result["applied"]["sent"]
    assert sent is not None, result["applied"]  # offered live at step 6
    assert sent["recommendation_id"].startswith("checkpoint-blocks") and sent["at_step"] > 6
    assert sent["apply_class"] == "live-exact"
    report = report_latest(home, tmp_path)
    [applied] = report["applied"]
    assert applied["recommendation_id"] == sent["recommendation_id"]
    assert applied["at_step"] >= sent["at_step"] and applied["status"] == "kept", applied
    assert [s["loss"] for s in report["steps"]] == bare


@pytest.mark.slow
def test_the_readmes_example_runs_as_pasted(tmp_path: Path) -> None:
    """README "In your own process": the snippet, as written, records a session `advisor report` reads."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### In your own process"):]
    start = section.index("```python\n") + len("```python\n")
    snippet = section[start:section.index("\n```", start)]
    script = tmp_path / "notebook.py"
    script.write_text(snippet)
    home = tmp_path / "home"
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(home), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = report_latest(home, tmp_path)
    assert [s["index"] for s in recorded["steps"]] == list(range(30))
    assert done.stdout.splitlines()[-1] == recorded["diagnosis"]["summary"]


def test_import_advisor_stays_cheap() -> None:
    """``import advisor`` (for ``advisor.session``) loads neither torch nor the agent: a session
    loads them when it starts."""
    code = ("import sys, advisor; print(sorted(m for m in ('torch', 'advisor.agent', 'numpy', 'rich', 'textual') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_the_api_stays_callable_beside_the_controllers_modules() -> None:
    """The controller's session lives in ``advisor.controller``: no submodule of ours is named
    ``session``, so importing the controller leaves ``advisor.session`` the API's function."""
    import pkgutil

    import advisor
    import advisor.controller  # noqa: F401

    assert "session" not in {m.name for m in pkgutil.iter_modules(advisor.__path__)}
    assert callable(advisor.session) and advisor.session.__module__ == "advisor.api"
    opened = advisor.session(name="beside", probes="memory")
    assert isinstance(opened, advisor.InProcessSession) and not opened.active
    assert opened.name == "beside"


def test_a_bad_argument_is_one_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    """The controller parses the arguments as `advisor attach` parses its options: the same checks,
    the same words, raised in the user's process before any hook is installed."""
    import advisor

    for kwargs, words in (({"memory_budget": "lots"}, "--memory-budget"), ({"probes": "memry"}, "memry"),
                          ({"log_to": "neptune"}, "unknown tracker 'neptune'")):
        with pytest.raises(advisor.AdvisorError, match=words) as raised:
            with advisor.session(**kwargs):
                pytest.fail("the block must not run")
        assert raised.value.exit_code == 2
    assert not (Path(os.environ["ADVISOR_HOME"]) / "sessions").exists() or not any(
        (Path(os.environ["ADVISOR_HOME"]) / "sessions").iterdir())
    assert "advisor.agent.lifecycle" not in sys.modules or not sys.modules["advisor.agent.lifecycle"].present()
