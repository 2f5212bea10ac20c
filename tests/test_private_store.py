"""The suite never touches the user's session store, even from module-scoped fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A module-scoped fixture that records into the session store, as tests/test_closed_loop.py's
# do: function-scoped fixtures have not run yet when it does.
PROBE = '''
import pytest
from advisor.paths import new_session_dir

@pytest.fixture(scope="module")
def recorded():
    return new_session_dir("train.py")

def test_recorded(recorded):
    assert recorded.is_dir()
'''


def test_suite_fixtures_leave_an_empty_home_empty(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    probe = tmp_path / "probe" / "test_probe.py"
    probe.parent.mkdir()
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("ADVISOR_HOME", "XDG_DATA_HOME")}
    env.update(HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    # The suite's own conftest, loaded as a plugin, provides the fixtures.
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                          "--rootdir", str(probe.parent), str(probe)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == []
