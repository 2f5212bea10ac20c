"""One remedy contract: the predictor's ``SPEC`` states a remedy's params and phase once, the applier
is found by name and agrees with it, every rule gets its remedies the same way, and a remedy added
in a folder of its own (no shared file edited) is proposed, checked and applied."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from advisor.apply import registry
from advisor.recommend import remedies
from advisor.recommend.rules import rules

ROOT = Path(__file__).resolve().parents[1]


def _keywords(name: str) -> tuple[set[str], set[str]]:
    """(required, optional) keyword-only parameters of ``apply_<name>``."""
    params = inspect.signature(registry.get(name)).parameters.values()
    keyword = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return ({p.name for p in keyword if p.default is inspect.Parameter.empty},
            {p.name for p in keyword if p.default is not inspect.Parameter.empty})


def test_every_predictor_has_an_applier_that_agrees_or_is_a_restart_that_says_how() -> None:
    specs = remedies.specs()
    appliers = set(registry.remedy_names())
    assert specs and appliers
    for name, spec in specs.items():
        if name in appliers:
            required, optional = _keywords(name)
            assert (set(spec.params), set(spec.optional)) == (required, optional), name
            assert registry.phase(name) == spec.phase, name
        else:
            # No live applier: a restart remedy, carried by a plan's environment or by a change to
            # the script that the recommendation states.
            assert spec.apply_class == "restart", name
            assert spec.plan_env or spec.restart_change, name
    assert appliers <= set(specs), f"appliers without a predictor: {sorted(appliers - set(specs))}"


def test_every_remedy_addresses_a_rule_and_every_proposer_is_reached() -> None:
    names = {rule.args[0] for rule in rules()}
    assert {"memory", "input", "compute", "communication", "host_overhead", "fragmentation", "optimizer_step",
            "pipeline_balance", "straggler"} <= names
    for spec in remedies.specs().values():
        assert spec.propose is not None and spec.addresses, spec.name  # every remedy is proposed somehow
        assert set(spec.addresses) <= names, (spec.name, spec.addresses)
    assert [s for s in remedies.specs().values() if s.fallback] == [remedies.spec("cpu_offload")]


PREDICTOR = '''
"""A tiny remedy's predictor: more input threads for a data-bound job (a test plug-in)."""

from advisor.recommend.finding import Proposal
from advisor.recommend.remedies import RemedySpec
from advisor.records.advice import Prediction, Recommendation


def validate(params):
    if not isinstance(params.get("threads"), int) or params["threads"] < 1:
        raise ValueError(f"threads must be an integer >= 1, not {params.get('threads')!r}")


def propose(profile, finding):
    wait, step = profile.phases["data_s"], profile.step_time_s
    return Proposal(recommendations=(Recommendation(
        id="tiny-threads", remedy=SPEC.name, title="More input threads", params={"threads": 4},
        predicted=Prediction(peak_memory_bytes=None, step_time_s=step - wait / 2),
        baseline=Prediction(peak_memory_bytes=None, step_time_s=step), budget_bytes=profile.budget_bytes,
        cost_model="half the wait (assumed)", confidence="low", exact=True, live=True),))


SPEC = RemedySpec(name="tiny_threads", apply_class="live-exact", params=("threads",), validate=validate,
                  phase="optimizer", addresses=("input",), propose=propose)
'''

APPLIER = '''
"""A tiny remedy's applier (a test plug-in): records what it was asked, reverts exactly."""

PHASE = "optimizer"
APPLIED = []


class Handle:
    def revert(self):
        APPLIED.pop()


def apply_tiny_threads(target, *, threads):
    APPLIED.append(threads)
    return Handle()
'''

DRIVE = '''
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from advisor.apply import registry
from advisor.apply.target import Target
from advisor.recommend import remedies
from advisor.recommend.advise import advise
from advisor.recommend.profile import Profile
diagnosis, recs = advise(Profile(peak_bytes=0, step_time_s=0.1, phases={"data_s": 0.05}))
[rec] = [r for r in recs if r.remedy == "tiny_threads"]
remedies.check_params(rec.remedy, rec.params)
registry.check_params(rec.remedy, rec.params)
handle = registry.apply_remedy(Target(), rec.remedy, rec.params)
from advisor.apply.remedies import tiny_threads
applied = list(tiny_threads.APPLIED)
handle.revert()
try:
    remedies.check_params(rec.remedy, {"threads": 0})
    refused = None
except ValueError as exc:
    refused = str(exc)
print(json.dumps({"bottleneck": diagnosis.bottleneck, "id": rec.id, "applied": applied,
                  "after_revert": tiny_threads.APPLIED, "refused": refused,
                  "phase": registry.phase(rec.remedy), "spec_phase": remedies.spec(rec.remedy).phase}))
'''


def test_a_remedy_in_a_folder_of_its_own_is_proposed_checked_and_applied(tmp_path) -> None:
    """The next remedy touches two new files and no shared one: its predictor (with the rule it
    addresses) and its applier, each found by discovery. Here they live outside the repository."""
    for half, text in (("recommend", PREDICTOR), ("apply", APPLIER)):
        folder = tmp_path / "advisor" / half / "remedies"
        folder.mkdir(parents=True)
        (folder / "tiny_threads.py").write_text(textwrap.dedent(text))
    out = subprocess.run([sys.executable, "-c", DRIVE, str(ROOT), str(tmp_path)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout)
    assert seen["bottleneck"] == "input" and seen["id"] == "tiny-threads"  # the input rule asked it
    assert seen["applied"] == [4] and seen["after_revert"] == []
    assert "threads must be an integer >= 1" in seen["refused"]
    assert seen["phase"] == seen["spec_phase"] == "optimizer"


def test_the_agent_imports_no_specific_applier() -> None:
    """The agent reaches remedies by name through the registry (issue 36 item 3): capture.py read a
    DataLoader through the DataLoader remedy and saves.py ZeRO's stage through the ZeRO remedy."""
    import ast
    from pathlib import Path

    agent = Path(__file__).resolve().parents[1] / "advisor" / "agent"
    found = []
    for path in sorted(agent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.name}: {n}" for n in names if n.startswith("advisor.apply.remedies")]
    assert found == []
