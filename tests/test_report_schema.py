"""The JSON report's field names and value types do not change (docs/report-schema.md: add, never rename).

tests/data/report_schema.json holds, for each recorded session of tests/data (and for one with apply
history, below), every key path of ``advisor report --json`` with the JSON types found there; it was
written before the controller's dicts became typed records. The recorded sessions give the same report
on every run, so their maps are compared exactly, path by path: a path may be added (a new field), none
may disappear or change type. A fresh ``advisor attach`` of examples/gpt.py with a live apply (slow)
checks the paths every such run has had.

``ADVISOR_UPDATE_SCHEMA=1 python3 -m pytest tests/test_report_schema.py`` rewrites the fixture: only for an
added field, documented in docs/report-schema.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.records.samples import Event
from advisor.report import build_report
from advisor.state import LiveState
from recorded import DATA, feed
from report_schema import schema

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = DATA / "report_schema.json"
RECORDED = ("gpt", "ddp", "oom", "gpt_h100")
UPDATE = os.environ.get("ADVISOR_UPDATE_SCHEMA") == "1"
FRESH = "attach --apply auto examples/gpt.py"
FRESH_ARGS = ("--headless", "--steps", "14", "--memory-budget", "30MB", "--apply", "auto", "--apply-at-step", "5",
              "examples/gpt.py")

_MEASURED_BEFORE = {"peak_memory_bytes": 34411364, "step_time_s": 0.27, "steps": [1, 4], "time_steps": [4],
                    "peak_steps": [1], "step_kind": "light"}
_MEASURED_AFTER = {"peak_memory_bytes": 26514276, "step_time_s": 0.31, "steps": [5, 6, 7], "time_steps": [7],
                   "peak_steps": [5, 6], "step_kind": "light"}
_PARAMS = {"modules": ["blocks.0", "blocks.1"]}
# The apply history's wire forms as the executor sent them before the typed core (one of each kind the
# report's ``applied`` section holds: kept, reverted after its window, failed, and a user's revert).
APPLY_EVENTS: tuple[tuple[int, str, dict], ...] = (
    (5, "apply_started", {"remedy": "activation_checkpointing", "recommendation_id": "checkpoint-blocks-2",
                          "params": _PARAMS, "at_step": 5, "measure_steps": 3, "before": _MEASURED_BEFORE}),
    (8, "apply_result", {"remedy": "activation_checkpointing", "recommendation_id": "checkpoint-blocks-2",
                         "params": _PARAMS, "rank": 0, "at_step": 5,
                         "predicted": {"peak_memory_bytes": 26514276, "step_time_s": 0.3},
                         "measured": {"before": _MEASURED_BEFORE, "after": _MEASURED_AFTER},
                         "status": "kept", "error": None, "reason": "peak fits the budget"}),
    (9, "apply_reverted", {"remedy": "activation_checkpointing", "recommendation_id": "checkpoint-blocks-2",
                           "at_step": 9, "reason": "reverted on request"}),
    (10, "apply_result", {"remedy": "fused_optimizer", "recommendation_id": "fused-optimizer", "params": {},
                          "rank": 0, "at_step": 10, "predicted": {"peak_memory_bytes": None, "step_time_s": 0.2},
                          "measured": {"before": _MEASURED_BEFORE, "after": _MEASURED_AFTER},
                          "status": "reverted", "error": None, "reason": "slower than predicted"}),
    (12, "apply_result", {"remedy": "compile_blocks", "recommendation_id": "compile-blocks",
                          "params": {"modules": ["blocks"]}, "rank": 0, "at_step": None,
                          "predicted": {"peak_memory_bytes": None, "step_time_s": 0.25},
                          "measured": {"before": {"peak_memory_bytes": None, "step_time_s": None, "steps": [],
                                                  "time_steps": [], "peak_steps": [], "step_kind": None},
                                       "after": {"peak_memory_bytes": None, "step_time_s": None, "steps": [],
                                                 "time_steps": [], "peak_steps": [], "step_kind": None}},
                          "status": "failed", "error": "RuntimeError: no compiler", "reason": "apply failed"}),
)


def recorded_report(name: str) -> dict:
    live = LiveState(session_id=name, session_path="recorded")
    meta = feed(live, name.removesuffix("+applied"))
    if name.endswith("+applied"):
        for step, kind, data in APPLY_EVENTS:
            live.add(Event(rank=0, step=step, name=kind, data=json.loads(json.dumps(data))))
    live.update(finished=bool(meta.get("finished")), exit_code=meta.get("exit_code"),
                exit_reason=meta.get("exit_reason", ""))
    return build_report(live.snapshot())


def fresh_report(tmp_path: Path) -> dict:
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--json", str(out), *FRESH_ARGS], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


def _fixture() -> dict[str, dict[str, list[str]]]:
    return json.loads(FIXTURE.read_text())


def _compare(expected: dict[str, list[str]], got: dict[str, list[str]], *, exact_types: bool) -> list[str]:
    """What changed: a path gone, or its value types. Null is a value's absence, not a type: a figure
    that became known (a remedy that leaves memory as it is now predicts the measured peak) or
    unknown changes a value; a path always null may take any type."""
    problems = []
    for path, types in expected.items():
        was, now = set(types) - {"null"}, set(got.get(path, ())) - {"null"}
        if path not in got:
            problems.append(f"{path}: missing (was {types})")
        elif not was:
            continue
        elif (exact_types and now != was) or (not exact_types and not now <= was):
            problems.append(f"{path}: types {got[path]}, were {types}")
    return problems


@pytest.mark.parametrize("name", [*RECORDED, "gpt+applied"])
def test_the_report_of_a_recorded_session_keeps_its_schema(name, tmp_path):
    got = schema(recorded_report(name))
    if UPDATE:
        table = _fixture() if FIXTURE.exists() else {}
        table[name] = got
        FIXTURE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    expected = _fixture()[name]
    assert not _compare(expected, got, exact_types=True), "\n".join(_compare(expected, got, exact_types=True))


def test_the_applied_history_is_in_the_fixture():
    # The fixture holds each kind of applied entry: without the user's revert (no "measured" key) and a
    # result with one, the test above would not notice either shape changing.
    applied = {p for p in _fixture()["gpt+applied"] if p.startswith("$.applied[]")}
    assert "$.applied[].measured.after.peak_steps[]" in applied and "$.applied[].error" in applied
    assert _fixture()["gpt+applied"]["$.applied[].error"] == ["null", "string"]


@pytest.mark.slow
def test_a_fresh_attach_with_an_apply_keeps_its_schema(tmp_path):
    got = schema(fresh_report(tmp_path))
    if UPDATE:
        # The paths two fresh runs both had (which recommendations appear depends on timings).
        table = _fixture()
        again = schema(fresh_report(tmp_path))
        table[FRESH] = {p: sorted(set(got[p]) | set(again[p])) for p in got if p in again}
        FIXTURE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    expected = _fixture()[FRESH]
    problems = _compare(expected, got, exact_types=False)
    assert not problems, "\n".join(problems)
