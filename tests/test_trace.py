"""The Perfetto trace: one clock for steps, phases, ops and memory counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.records.samples import MEMORY_CATEGORIES, MemorySample, OpStat, StepSample
from advisor.state import LiveState
from advisor.trace import write_trace


def test_steps_ops_and_counters_share_one_clock(tmp_path: Path) -> None:
    live = LiveState()
    t0 = 1_700_000_000.0  # epoch seconds, as StepSample.end_time
    for index, deep in ((0, False), (1, True), (2, False)):
        live.add(StepSample(index=index, time_s=0.1, deep=deep, end_time=t0 + 0.1 * (index + 1),
                            phases={"data_s": 0.01, "forward_s": 0.04, "backward_s": 0.04, "optimizer_s": 0.01}))
    full = {c: 0 for c in MEMORY_CATEGORIES} | {"activation": 64}
    live.add(MemorySample(step=1, time=0.05, event="op", categories=full, total_bytes=64))
    for name, t in (("aten.mm", 0.03), ("aten.add", 0.02)):  # 0.05 s of ops in a 0.04 s forward
        live.add(OpStat(step=1, name=name, module="fc", phase="forward", count=1, flops=10, bytes=8, time_s=t))
    path = tmp_path / "t.json"
    write_trace(live.snapshot(), str(path))
    events = json.loads(path.read_text())["traceEvents"]
    step1 = next(e for e in events if e["ph"] == "X" and e["name"] == "step 1")
    forward = next(e for e in events if e["ph"] == "X" and e["name"] == "forward" and step1["ts"] <= e["ts"] < step1["ts"] + step1["dur"])
    ops = [e for e in events if e["ph"] == "X" and e["name"].startswith("aten.")]
    counter = next(e for e in events if e["ph"] == "C")
    assert step1["ts"] == pytest.approx((t0 + 0.1) * 1e6)
    assert counter["ts"] == pytest.approx(step1["ts"] + 0.05e6)  # same clock, inside its step
    assert [o["name"] for o in ops] == ["aten.mm", "aten.add"]
    assert ops[0]["ts"] == pytest.approx(forward["ts"])
    assert ops[-1]["ts"] + ops[-1]["dur"] <= forward["ts"] + forward["dur"] + 1e-3  # shrunk to fit its phase
    assert ops[0]["args"]["measured_s"] == pytest.approx(0.03)
