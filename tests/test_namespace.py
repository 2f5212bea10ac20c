"""The user's namespace is theirs: a script beside its own ``probes.py``, ``apply.py``,
``recommend.py``, ``agent.py`` and ``advisor.py`` runs under ``advisor attach`` exactly as under
python, importing its own modules, while the advisor's modules are not shadowed either."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWN = ("probes", "apply", "recommend", "agent", "advisor", "records")

SCRIPT = """
import sys

import torch

import agent, advisor, apply, probes, recommend, records

print("own:", ",".join(m.WHO for m in (probes, apply, recommend, agent, advisor, records)))
print("path0:", sys.path[0])
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
"""


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    for name in OWN:
        (folder / f"{name}.py").write_text(f"WHO = 'user-{name}'\n")
    (folder / "train.py").write_text(textwrap.dedent(SCRIPT))
    return folder


@pytest.mark.slow
def test_script_with_colliding_module_names_imports_its_own(user_folder: Path, tmp_path: Path):
    bare = subprocess.run([sys.executable, "train.py"], cwd=user_folder, capture_output=True, text=True,
                          timeout=120)
    assert bare.returncode == 0, bare.stderr
    report = tmp_path / "r.json"
    # cwd is the user's folder too: neither it nor the script's folder may shadow the advisor.
    # As the `advisor` console script starts: its own folder first on sys.path, not the cwd.
    cli = f"import sys; sys.path[0] = {str(ROOT)!r}; from advisor.cli import main; sys.exit(main())"
    run = subprocess.run([sys.executable, "-c", cli, "attach", "--headless", "--probes", "none",
                          "--json", str(report), "train.py"], cwd=user_folder, capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert "own: " + ",".join(f"user-{n}" for n in ("probes", "apply", "recommend", "agent", "advisor",
                                                    "records")) in run.stdout
    assert f"path0: {user_folder}" in run.stdout
    assert [l for l in run.stdout.splitlines() if l.startswith("step ")] == \
        [l for l in bare.stdout.splitlines() if l.startswith("step ")]
    data = json.loads(report.read_text())
    assert len([s for s in data["steps"] if s["rank"] == 0]) == 3


def test_advisor_packages_are_namespaced():
    """The installed import names live under ``advisor.``; the bare top-level names are not ours."""
    code = ("import advisor.probes.probe, advisor.apply.registry, advisor.recommend.advise, "
            "advisor.agent.bootstrap, advisor.records.samples, sys; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('probes', 'apply', 'recommend', 'agent', 'records')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
