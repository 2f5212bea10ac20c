"""After an apply the report shows the job before the remedy, after it, and after a revert."""

from __future__ import annotations

import pytest

from advisor.records.results import ApplyResult
from advisor.records.samples import MEMORY_CATEGORIES, Event, MemorySample, ModuleStat, OpStat, StepSample
from advisor.report import build_report
from advisor.sections.regimes import build_regimes_section
from advisor.state import LiveState


def _mem(step: int, total: int) -> MemorySample:
    cats = {c: 0 for c in MEMORY_CATEGORIES} | {"activation": total}
    return MemorySample(step=step, time=0.01, event="op", categories=cats, total_bytes=total)


def _session(revert: bool) -> LiveState:
    live = LiveState()
    # steps 0-5 before (1, 2 deep), apply at 6, measured on 6-8, then (maybe) reverted from 9.
    for index in range(12):
        after = 6 <= index < 9 or (index >= 9 and not revert)
        live.add(StepSample(index=index, time_s=0.3 if after else 0.2, deep=index in (1, 2, 6),
                            end_time=100.0 + index))
        live.add(_mem(index, 20 << 20 if after else 30 << 20))
    live.add(OpStat(step=2, name="aten.mm", module="blocks.0", phase="forward", count=1, flops=10, bytes=8,
                    time_s=0.05))
    live.add(OpStat(step=6, name="aten.bmm", module="blocks.0", phase="backward", count=1, flops=10, bytes=8,
                    time_s=0.05))
    live.add(ModuleStat(step=2, name="blocks.0", activation_bytes=8 << 20))
    live.add(ModuleStat(step=6, name="blocks.0", activation_bytes=1 << 20))
    live.add(Event(step=6, name="apply_started", data={"remedy": "activation_checkpointing", "at_step": 6}))
    result = {"remedy": "activation_checkpointing", "at_step": 6, "status": "reverted" if revert else "kept",
              "measured": {"before": {"steps": [3, 4, 5]}, "after": {"steps": [6, 7, 8]}}}
    live.add(Event(step=9, name="apply_result", data=result))
    return live


def test_before_and_after_a_kept_remedy_are_summarised_apart() -> None:
    regimes = build_regimes_section(_session(revert=False).snapshot(), None)
    assert [r["label"] for r in regimes] == ["before any remedy", "after activation_checkpointing"]
    before, after = regimes
    assert (before["first_step"], before["last_step"], after["first_step"], after["last_step"]) == (0, 5, 6, 11)
    assert before["peak_bytes"] == 30 << 20 and after["peak_bytes"] == 20 << 20
    assert before["step_time_s"] == pytest.approx(0.2)  # warm-up step 0 and deep steps left out
    assert after["step_time_s"] == pytest.approx(0.3)
    assert [o["name"] for o in before["top_ops"]] == ["aten.mm"]
    assert [o["name"] for o in after["top_ops"]] == ["aten.bmm"]
    assert before["top_modules"][0]["activation_bytes"] == 8 << 20
    assert after["top_modules"][0]["activation_bytes"] == 1 << 20


def test_a_revert_starts_a_third_regime() -> None:
    regimes = build_regimes_section(_session(revert=True).snapshot(), None)
    assert [r["label"] for r in regimes] == ["before any remedy", "after activation_checkpointing",
                                             "after reverting activation_checkpointing"]
    assert [r["peak_bytes"] for r in regimes] == [30 << 20, 20 << 20, 30 << 20]
    assert regimes[2]["first_step"] == 9 and regimes[2]["step_time_s"] == pytest.approx(0.2)


def test_no_apply_no_regimes_and_the_report_carries_them() -> None:
    live = LiveState()
    live.add(StepSample(index=0, time_s=0.1))
    assert build_regimes_section(live.snapshot(), None) == []
    report = build_report(_session(revert=True).snapshot())
    assert len(report["regimes"]) == 3


def test_module_rows_stay_and_say_they_are_checkpointed() -> None:
    live = _session(revert=False)
    live.update(applied=[ApplyResult(remedy="activation_checkpointing", status="kept", at_step=6,
                                     params={"modules": ["blocks.0"]})])
    rows = build_report(live.snapshot())["memory"]["modules"]
    assert [(r["name"], r["checkpointed"]) for r in rows] == [("blocks.0", True)]
    reverted = _session(revert=True).snapshot()
    assert not any(r["checkpointed"] for r in build_report(reverted)["memory"]["modules"])


def test_a_regime_shows_the_peak_its_diagnosis_reads_when_the_steps_carry_a_higher_one() -> None:
    """The steps' own peaks (a light path's) above the tracked totals: the regime's peak is the
    tracked one, the figure the memory section and a diagnosis of the regime read (it showed the
    larger, and the checker caught an 8.52 MB regime beside an 8.47 MB diagnosis)."""
    live = _session(revert=False)
    for index in range(6, 12):
        live.add(StepSample(index=index, time_s=0.3, deep=index == 6, end_time=100.0 + index,
                            peak_memory_bytes=(20 << 20) + 4096))
    regimes = build_regimes_section(live.snapshot(), None)
    assert regimes[1]["peak_bytes"] == 20 << 20
