"""``advisor diff A B`` and its ``--fail-on`` gate on two sessions recorded from known records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.diff import check_gate, compute_diff, parse_gate
from advisor.paths import DB_NAME
from advisor.records.samples import CollectiveStat, MemorySample, OpStat, RunInfo, StepSample
from advisor.report import build_report
from advisor.state import LiveState
from advisor.store import SessionStore, load_state

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def _records(*, step_s: float, forward_s: float, backward_s: float, activation_mib: int, mm_s: float,
             exposed_s: float) -> list:
    phases = {"data_s": 0.010, "forward_s": forward_s, "backward_s": backward_s, "optimizer_s": 0.015,
              "other_s": 0.005}
    assert sum(phases.values()) == pytest.approx(step_s)
    out: list = [RunInfo(script="train.py", argv=[], device={"type": "cpu", "name": "cpu"})]
    out.append(StepSample(index=0, time_s=1.0, phases={**phases, "other_s": 1.0 - step_s + 0.005}))
    out += [StepSample(index=i, time_s=step_s, phases=phases) for i in range(1, 5)]
    out.append(MemorySample(step=1, time=0.05, categories={"parameter": 100 * MiB, "gradient": 100 * MiB,
                                                           "optimizer_state": 200 * MiB,
                                                           "activation": activation_mib * MiB},
                            total_bytes=(400 + activation_mib) * MiB))
    out.append(OpStat(step=1, name="aten.mm", phase="forward", input_shapes=[[64, 64], [64, 64]], dtype="float32",
                      count=2, flops=2 * 2 * 64 ** 3, bytes=2 * 3 * 64 * 64 * 4, time_s=mm_s))
    out.append(OpStat(step=1, name="aten.add", phase="forward", input_shapes=[[64, 64]], dtype="float32",
                      count=1, flops=64 * 64, bytes=3 * 64 * 64 * 4, time_s=0.005))
    out += [CollectiveStat(step=i, op="all_reduce", group_size=2, bytes=MiB, dtype="float32", start=float(i),
                           time_s=0.010, exposed_s=exposed_s) for i in range(5)]
    return out


A = dict(step_s=0.100, forward_s=0.030, backward_s=0.040, activation_mib=300, mm_s=0.020, exposed_s=0.004)
B = dict(step_s=0.107, forward_s=0.033, backward_s=0.044, activation_mib=380, mm_s=0.025, exposed_s=0.006)


def _store(home: Path, name: str, records: list) -> Path:
    folder = home / "sessions" / name
    folder.mkdir(parents=True)
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=name, finished=True)
    for record in records:
        store.put(record)
    store.close()
    return folder


def _state(records: list):
    live = LiveState(session_id="s")
    for record in records:
        live.add(record)
    return live.snapshot()


def _diff():
    a, b = _state(_records(**A)), _state(_records(**B))
    return compute_diff(a, build_report(a), b, build_report(b))


def test_step_time_phases_and_memory_changes_are_exact():
    d = _diff()
    assert d["schema"] == "advisor.diff/1"
    assert d["step_time"]["a"] == pytest.approx(0.100) and d["step_time"]["b"] == pytest.approx(0.107)
    assert d["step_time"]["abs"] == pytest.approx(0.007) and d["step_time"]["rel"] == pytest.approx(0.07)
    assert d["phases"]["forward_s"]["abs"] == pytest.approx(0.003)
    assert d["phases"]["backward_s"]["rel"] == pytest.approx(0.1)
    assert d["phases"]["data_s"]["abs"] == pytest.approx(0.0)
    assert d["peak_memory"] == {"a": 700 * MiB, "b": 780 * MiB, "abs": 80 * MiB, "rel": pytest.approx(80 / 700)}
    assert d["memory_categories"]["activation"]["abs"] == 80 * MiB
    assert d["memory_categories"]["parameter"]["abs"] == 0


def test_top_ops_collectives_and_advice_side_by_side():
    d = _diff()
    first = d["ops"][0]
    assert (first["name"], first["phase"]) == ("aten.mm", "forward")
    assert first["time_s"]["abs"] == pytest.approx(0.005) and first["time_s"]["rel"] == pytest.approx(0.25)
    assert d["ops"][1]["name"] == "aten.add" and d["ops"][1]["time_s"]["abs"] == pytest.approx(0.0)
    (coll,) = d["collectives"]
    assert coll["op"] == "all_reduce" and coll["count"]["a"] == pytest.approx(1.0)
    assert coll["exposed_s"]["abs"] == pytest.approx(0.002) and coll["exposed_s"]["rel"] == pytest.approx(0.5)
    assert coll["bytes"]["b"] == pytest.approx(MiB)
    assert d["metrics"]["exposed_comm"]["a"] == pytest.approx(0.004)
    assert set(d["diagnosis"]) == {"a", "b", "changed"}
    assert d["diagnosis"]["changed"] == (d["diagnosis"]["a"]["bottleneck"] != d["diagnosis"]["b"]["bottleneck"])


def test_gate_crosses_exactly_the_thresholds_exceeded():
    d = _diff()
    failed = check_gate(d, parse_gate("step_time:+5%,peak_memory:+10%"))
    assert [f["metric"] for f in failed] == ["step_time", "peak_memory"]
    assert failed[0]["reason"] == "step_time +7.0% (100 ms -> 107 ms) crosses +5%"
    assert failed[1]["reason"] == "peak_memory +11.4% (700 MiB -> 780 MiB) crosses +10%"
    assert check_gate(d, parse_gate("step_time:+7.5%,peak_memory:+12%")) == []
    assert [f["metric"] for f in check_gate(d, parse_gate("step_time:+5ms, peak_memory:+100MiB"))] == ["step_time"]
    assert check_gate(d, parse_gate("forward_time:-1%")) == []  # it went up, not down
    assert check_gate(d, parse_gate("exposed_comm:+60%")) == []  # +50%
    assert [f["metric"] for f in check_gate(d, parse_gate("exposed_comm:+40%"))] == ["exposed_comm"]


def test_a_gate_on_a_metric_one_session_lacks_fails_loudly():
    a = _state(_records(**A))
    b = _state([r for r in _records(**B) if not isinstance(r, MemorySample)])  # e.g. a trace without memory
    d = compute_diff(a, build_report(a), b, build_report(b))
    (failure,) = check_gate(d, parse_gate("peak_memory:+5%"))
    assert failure["reason"] == "peak_memory: cannot check +5%: not measured in session B"


@pytest.mark.parametrize("spec", ["step_time", "speed:+5%", "step_time:+5", "peak_memory:+5ms", ",", "step_time:+x%"])
def test_malformed_gate_specs_are_refused(spec):
    with pytest.raises(ValueError, match="step_time"):
        parse_gate(spec)


def test_cli_diff_json_gate_and_usage_errors(tmp_path):
    home = tmp_path / "home"
    _store(home, "20260101-000000-a-0001", _records(**A))
    _store(home, "20260101-000001-b-0002", _records(**B))
    env = {**os.environ, "ADVISOR_HOME": str(home)}

    def advisor(*args):
        return subprocess.run([sys.executable, "-m", "advisor", "diff", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    out = tmp_path / "diff.json"
    proc = advisor("a-0001", "b-0002", "--json", str(out), "--fail-on", "step_time:+5%,peak_memory:+10%")
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "regression:" in line]
    assert lines == ["advisor: regression: step_time +7.0% (100 ms -> 107 ms) crosses +5%",
                     "advisor: regression: peak_memory +11.4% (700 MiB -> 780 MiB) crosses +10%"]
    data = json.loads(out.read_text())
    assert data["schema"] == "advisor.diff/1" and len(data["gate"]["failures"]) == 2
    assert data["a"]["id"] == "20260101-000000-a-0001"
    passed = advisor("a-0001", "b-0002", "--fail-on", "step_time:+10%")
    assert passed.returncode == 0 and "step (median)" in passed.stdout
    bad = advisor("a-0001", "b-0002", "--fail-on", "latency:+5%")
    assert bad.returncode == 2 and "valid metrics: step_time, peak_memory" in bad.stderr
    missing = advisor("a-0001", "nope")
    assert missing.returncode == 3 and "no session 'nope'" in missing.stderr


def test_diff_of_a_stored_session_equals_the_in_memory_one(tmp_path):
    folder = _store(tmp_path, "s", _records(**A))
    state = load_state(folder / DB_NAME)
    d = compute_diff(state, build_report(state), _state(_records(**B)), build_report(_state(_records(**B))))
    assert d["step_time"]["rel"] == pytest.approx(0.07)
