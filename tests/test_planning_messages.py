"""`advisor plan`: which session it plans from, and why there is nothing to plan."""

from __future__ import annotations

from advisor.planning import _nothing_to_plan, memory_trouble
from advisor.records.samples import MEMORY_CATEGORIES, Event, MemorySample, RunInfo
from advisor.state import LiveState


def _state(peak: int, budget: int | None, *, oom: bool = False, kept: bool = False):
    live = LiveState()
    live.add(RunInfo(script="s.py", argv=[], config={"memory_budget_bytes": budget} if budget else {}))
    cats = {c: 0 for c in MEMORY_CATEGORIES} | {"activation": peak}
    live.add(MemorySample(step=1, time=0.0, event="op", categories=cats, total_bytes=peak))
    if oom:
        live.add(Event(step=2, name="oom", data={"op": "aten.mm"}))
    if kept:
        live.add(Event(step=6, name="apply_result", data={"remedy": "activation_checkpointing", "status": "kept",
                                                          "at_step": 5}))
    return live.snapshot()


def test_memory_trouble() -> None:
    assert memory_trouble(_state(10, 20)) is None
    assert memory_trouble(_state(10, None, oom=True)) == "it ran out of memory"
    assert "went over its" in memory_trouble(_state(30 << 20, 24 << 20))
    # Over the budget before a remedy that was kept: the job as it runs now fits.
    assert memory_trouble(_state(30 << 20, 24 << 20, kept=True)) is None


def test_nothing_to_plan_says_why() -> None:
    no_data = _nothing_to_plan({"memory": {"peak_bytes": None}})
    assert "no memory measurements" in str(no_data) and "--probes" in (no_data.hint or "")
    fits = _nothing_to_plan({"memory": {"peak_bytes": 10 << 20, "budget_bytes": 20 << 20}, "applied": []})
    assert "the job fits (peak 10.0 MiB of a 20.0 MiB budget)" in str(fits)
    assert "--memory-budget below 10.0 MiB" in (fits.hint or "")
    kept = _nothing_to_plan({"memory": {"peak_bytes": 10 << 20, "budget_bytes": 20 << 20},
                             "applied": [{"remedy": "activation_checkpointing", "status": "kept"}]})
    assert "already makes it fit" in str(kept) and "no SESSION" in (kept.hint or "")
