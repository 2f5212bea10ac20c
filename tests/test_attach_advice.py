"""The report's advice is made from the report's own records (advisor/early_report.py, ``advised``).

A rank's last records can come in after the advice loop's last refresh; the report then read a
diagnosis peak of 8.47 MB beside its memory section's 8.52 MB (a loaded 2-rank ZeRO-3 run)."""

from __future__ import annotations

from checked import assert_consistent

from advisor.advice import advise_state
from advisor.early_report import advised as _advised
from advisor.records.samples import MemorySample, StepSample
from advisor.report import build_report
from advisor.state import LiveState


def test_a_memory_sample_after_the_last_refresh_is_in_the_reports_diagnosis() -> None:
    live = LiveState(session_id="late")
    for index in range(6):
        live.add(StepSample(index=index, time_s=0.1, end_time=100.0 + index, deep=index in (1, 2, 3),
                            phases={"forward_s": 0.1}))
    live.add(MemorySample(step=1, time=0.0, categories={"activation": 900}, total_bytes=900))
    budget = 960
    stale = advise_state(live.snapshot(), budget_bytes=budget)  # the loop's last refresh
    live.update(diagnosis=stale[0], recommendations=stale[1])
    live.add(MemorySample(step=5, time=0.0, categories={"activation": 950}, total_bytes=950))  # came in late
    state = live.snapshot()
    peak = {e.what: e.value for e in state.diagnosis.evidence}["peak memory"]
    assert peak == 900  # what the report used to show beside a 950 B memory section
    advised, advice = _advised(state, budget)
    report = build_report(advised, budget_bytes=budget, advice=advice)
    evidence = {e["what"]: e["value"] for e in report["diagnosis"]["evidence"]}
    assert evidence["peak memory"] == report["memory"]["peak_bytes"] == 950
    assert_consistent(report)
