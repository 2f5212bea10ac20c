"""examples/ddp.py on 2 gloo ranks under ``advisor attach``, switched live to ZeRO-2 or ZeRO-3 at
step 5 by the recommendation the memory budget selects (issue 11, end to end).

The budget is chosen from an unswitched attached run: the recommender proposes the lowest stage
whose predicted peak fits, so a budget between the predicted peaks of stage k and stage k - 1
makes "zero-k" the recommendation. Whether the switch is then kept depends on the measured peak
(keep or revert is voted by both ranks); either way the losses rank 0 prints must match the
unswitched run's to 1e-6 (FSDP2 is live-equivalent: tests/test_zero_fsdp.py says why), every
rank must report the same outcome, and the report's ``zero`` section the stage left in force.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from checked import assert_consistent

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ["examples/ddp.py", "--hidden", "128", "--layers", "4", "--steps", "14"]
LOSS = re.compile(r"^step (\d+) loss (\S+)$")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def attach(home: Path, out: Path, *options: str, script: list[str] = SCRIPT, timeout: float = 300) -> list[float]:
    """``advisor attach --headless`` on 2 ranks; the losses rank 0 printed (its report checked)."""
    env = dict(os.environ, ADVISOR_HOME=str(home), OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    proc = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--nproc-per-node", "2",
                           "--json", str(out), *options, *script], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_consistent(json.loads(out.read_text()), str(out))  # the baseline's lies outside any tmp_path
    return [float(m.group(2)) for line in proc.stdout.splitlines() if (m := LOSS.match(line))]


def session_state(home: Path):
    from advisor.store import load_state

    [db] = sorted(home.glob("sessions/*/session.sqlite"))
    return load_state(db)


def budget_selecting(state, stage: int) -> int:
    """A memory budget under which the recommender's ZeRO proposal is stage ``stage``: the middle
    of the range of budgets that select it (scanned down from the measured peak)."""
    from advisor.advice import advise_state

    peak = max(m.total_bytes for m in state.memory)
    hits = []
    for i in range(200):
        budget = int(peak * (1 - i / 250))
        _, recs = advise_state(state, budget_bytes=budget)
        if any(r.id == f"zero-{stage}" and r.fits for r in recs):
            hits.append(budget)
    assert hits, f"no budget selects zero-{stage}"
    return (max(hits) + min(hits)) // 2


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    home = tmp_path_factory.mktemp("zero_base")
    losses = attach(home, home / "base.json")
    return losses, session_state(home)


@pytest.mark.parametrize("stage", [2, 3])
def test_examples_ddp_switched_live_keeps_its_losses_and_reports_the_stage(baseline, tmp_path, stage):
    base_losses, state = baseline
    budget = budget_selecting(state, stage)
    losses = attach(tmp_path, tmp_path / "zero.json", "--memory-budget", str(budget), "--apply", f"zero-{stage}",
                    "--apply-at-step", "5", "--steps", "14")
    assert len(losses) == len(base_losses) == 14
    assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(losses, base_losses)), (losses, base_losses)
    report = json.loads((tmp_path / "zero.json").read_text())
    applied = [a for a in report["applied"] if a["remedy"] == "zero"]
    assert sorted(a["rank"] for a in applied) == [0, 1]
    assert {a["params"]["stage"] for a in applied} == {stage} and {a["at_step"] for a in applied} == {5}
    [status] = {a["status"] for a in applied}  # both ranks did the same
    assert status in ("kept", "reverted"), applied
    expected = stage if status == "kept" else 0
    assert [(z["rank"], z["stage"]) for z in report["zero"]] == [(0, expected), (1, expected)]
    for a in applied:  # the prediction travelled with the apply and the peak after it was measured
        assert a["predicted"]["peak_memory_bytes"] and a["measured"]["after"]["peak_memory_bytes"]
