"""`advisor report`, `sessions`, `plan` and the advice loop run where torch cannot be imported.

Each command runs in a subprocess whose sitecustomize installs a meta-path finder that
raises ImportError for ``torch`` and every ``torch.*`` module, on a recorded session
(tests/data). A controller module that reaches torch, directly or through a deferred
import, fails here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import recorded

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # subprocesses (about 1 s each)

BLOCK_TORCH = '''
import sys


class _NoTorch:
    """Refuse torch, as on a machine that never installed it."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"No module named {name!r} (blocked by the torch-free test)")
        return None


sys.meta_path.insert(0, _NoTorch())
'''

ADVICE_LOOP = '''
import sys
sys.path.insert(0, "tests")
import recorded
from advisor.advice import AdviceLoop
from advisor.state import LiveState


class Session:
    live = LiveState()

    def send_command(self, command):
        return 1


loop = AdviceLoop(Session(), budget_bytes=None)
for record in recorded.read("oom")[1]:
    Session.live.add(record)
    loop.on_record(record)
assert loop.wait_idle(timeout=120)
loop.finish()
loop.close()
assert loop.last_error is None, loop.last_error
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules)
print(",".join(r.id for r in Session.live.snapshot().recommendations))
'''


@pytest.fixture
def env(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_TORCH)
    home = tmp_path / "home"
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "ADVISOR_HOME": str(home)}


def run(env, *args):
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_blocker_really_blocks_torch(env):
    proc = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "blocked by the torch-free test" in proc.stderr


def test_report_sessions_and_plan_without_torch(env, tmp_path):
    db = recorded.write_session("oom", Path(env["ADVISOR_HOME"]))
    session_id = db.parent.name
    assert session_id in run(env, "-m", "advisor", "sessions").stdout
    assert "checkpoint-blocks-4" in run(env, "-m", "advisor", "report", session_id).stdout  # the rich rendering
    out = tmp_path / "report.json"
    run(env, "-m", "advisor", "report", session_id, "--json", str(out), "--trace", str(tmp_path / "t.json"))
    report = json.loads(out.read_text())
    assert report["warnings"] == []  # no section failed on a missing torch
    assert [r["id"] for r in report["recommendations"]] == ["checkpoint-blocks-4"]
    plan = tmp_path / "plan.json"
    run(env, "-m", "advisor", "plan", session_id, "-o", str(plan))
    assert json.loads(plan.read_text())["remedies"][0]["params"]["modules"] == ["blocks.0", "blocks.1",
                                                                               "blocks.2", "blocks.3"]


def test_advice_loop_without_torch(env):
    assert run(env, "-c", ADVICE_LOOP).stdout.strip() == "checkpoint-blocks-4"
