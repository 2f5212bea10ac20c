"""`advisor plan`: which session it plans from, and why there is nothing to plan."""

from __future__ import annotations

from recommendations import recommendation

from advisor.planning import _nothing_to_plan, memory_trouble
from advisor.records.advice import Diagnosis
from advisor.records.results import ApplyResult
from advisor.records.samples import MEMORY_CATEGORIES, Event, MemorySample, RunInfo
from advisor.state import LiveState


def _state(peak: int | None, budget: int | None, *, oom: bool = False, kept: bool = False, device: str = "cpu"):
    live = LiveState()
    live.add(RunInfo(script="s.py", argv=[], config={"memory_budget_bytes": budget} if budget else {},
                     device={"type": device}))
    if peak is not None:
        cats = {c: 0 for c in MEMORY_CATEGORIES} | {"activation": peak}
        live.add(MemorySample(step=1, time=0.0, event="op", categories=cats, total_bytes=peak))
    if oom:
        live.add(Event(step=2, name="oom", data={"op": "aten.mm"}))
    if kept:
        live.add(ApplyResult(remedy="activation_checkpointing", status="kept", at_step=5).event(step=6))
    return live.snapshot()


def test_memory_trouble() -> None:
    assert memory_trouble(_state(10, 20)) is None
    assert memory_trouble(_state(10, None, oom=True)) == "it ran out of memory"
    assert "went over its" in memory_trouble(_state(30 << 20, 24 << 20))
    # Over the budget before a remedy that was kept: the job as it runs now fits.
    assert memory_trouble(_state(30 << 20, 24 << 20, kept=True)) is None


def test_nothing_to_plan_says_why() -> None:
    no_data = _nothing_to_plan(_state(None, None), None, None)
    assert "no memory measurements" in str(no_data) and "--probes" in (no_data.hint or "")
    fits = _nothing_to_plan(_state(10 << 20, 20 << 20), None, 20 << 20)
    assert "the job fits (peak 10.0 MiB of a 20.0 MiB budget)" in str(fits)
    assert "--memory-budget below 10.0 MiB" in (fits.hint or "")
    kept = _nothing_to_plan(_state(10 << 20, 20 << 20, kept=True), None, 20 << 20)
    assert "already makes it fit" in str(kept) and "no SESSION" in (kept.hint or "")


def test_an_oom_whose_recorded_peak_is_under_the_budget_is_not_called_a_fit() -> None:
    """The recorded peak stops short of the failed request: a job that ran out of memory with
    a peak of 17.6 MiB under an 18.0 MiB budget was told "the job fits"."""
    error = _nothing_to_plan(_state(17 << 20, 18 << 20, oom=True),
                             Diagnosis(bottleneck="memory", summary="out of memory in blocks.3.mlp.fc"), 18 << 20)
    assert "fits (" not in str(error)
    assert "out of memory in blocks.3.mlp.fc" in str(error) and "no remedy fits the 18.0 MiB budget" in str(error)


def test_a_memory_plan_for_a_cuda_job_carries_expandable_segments_and_keeps_the_users_options() -> None:
    """On an H200 the planned checkpointing run fitted its tensors and still ran out: the caching
    allocator held 730 MiB of reserve no tensor used. A memory plan for a CUDA job sets
    expandable segments (exact, a restart setting) beside the user's own allocator options."""
    from advisor.planning import _capped_cuda, plan_for
    from advisor.controller import merge_plan_env

    rec = recommendation("checkpoint-blocks-8", params={"modules": ["blocks.0"]})
    cuda = _state(10, None, device="cuda")
    assert _capped_cuda(cuda, rec) and not _capped_cuda(_state(10, None), rec)
    assert not _capped_cuda(cuda, recommendation("f", "fused_optimizer"))
    plan = plan_for(rec, capped_cuda=True)
    assert plan.env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert plan_for(rec).env == {}
    user = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:False"}
    assert merge_plan_env(user, plan.env) == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    assert merge_plan_env({}, plan.env) == plan.env
