"""The views' model on recorded sessions and hand-built states: ranks, slowest rank, events, filters."""

from __future__ import annotations

from recorded import load_state

from advisor.records.samples import Event, ExitInfo, MemorySample, StepSample
from advisor.state import SessionState
from advisor.tui.view_model import build_view_model, event_rows, rank_state, slowest


def _steps(rank: int, time_s: float, n: int = 5) -> list[StepSample]:
    return [StepSample(index=i, rank=rank, time_s=time_s, loss=1.0 / (i + 1), peak_memory_bytes=100 * (rank + 1))
            for i in range(n)]


def test_default_rank_is_the_slowest_not_rank_0() -> None:
    state = SessionState(steps={0: _steps(0, 0.10), 1: _steps(1, 0.30), 2: _steps(2, 0.20)})
    model = build_view_model(state)
    assert model.rank == 1 and model.slowest_rank == 1
    assert [(r.rank, r.median_step_s, r.peak_bytes) for r in model.ranks] == [(0, 0.10, 100), (1, 0.30, 200),
                                                                             (2, 0.20, 300)]
    assert build_view_model(state, rank=2).rank == 2
    assert build_view_model(state, rank=7).rank == 1  # a rank the session does not have: the slowest


def test_slowest_ignores_warm_up_and_deep_steps() -> None:
    fast_steady = [StepSample(index=0, rank=0, time_s=9.0)] + [StepSample(index=i, rank=0, time_s=0.1) for i in (1, 2)]
    deep_heavy = [StepSample(index=i, rank=1, time_s=0.2) for i in (1, 2)] + [StepSample(index=3, rank=1, time_s=5.0,
                                                                                          deep=True)]
    state = SessionState(steps={0: fast_steady, 1: deep_heavy})
    assert slowest(build_view_model(state).ranks) == 1


def test_rank_state_keeps_only_that_ranks_records() -> None:
    state = SessionState(steps={0: _steps(0, 0.1), 1: _steps(1, 0.2)},
                         memory=[MemorySample(rank=r, step=1, time=0.0, total_bytes=10 * (r + 1)) for r in (0, 1)],
                         events=[Event(rank=1, name="warning", data={"message": "x"}),
                                 Event(rank=0, name="device_spec", data={"peak_flops": {"fp32": 1.0}})])
    mine = rank_state(state, 1)
    assert list(mine.steps) == [1] and [m.total_bytes for m in mine.memory] == [20]
    assert [e.name for e in mine.events] == ["warning", "device_spec"]  # the device's roof is every rank's


def test_events_name_warnings_disabled_probes_applies_ooms_and_exits() -> None:
    state = SessionState(events=[
        Event(rank=0, step=1, name="warning", data={"message": "probe comm disabled: RuntimeError: no group"}),
        Event(rank=0, step=2, name="warning", data={"message": "deep sampling is slow"}),
        Event(rank=0, step=3, name="collective_seq", data={"calls": []}),
        Event(rank=0, step=4, name="apply_result", data={"remedy": "activation_checkpointing", "status": "kept"}),
        Event(rank=0, step=6, name="apply_reverted", data={"remedy": "activation_checkpointing"}),
        Event(rank=1, step=7, name="oom", data={"op": "aten.mm", "message": "asked for 2.00 GiB"}),
    ], exits={1: ExitInfo(rank=1, code=1, reason="exception", exc_type="OutOfMemoryError", message="CUDA")})
    assert [(r.kind, r.text) for r in event_rows(state)] == [
        ("probe", "probe comm disabled: RuntimeError: no group"),
        ("warning", "deep sampling is slow"),
        ("apply", "activation_checkpointing: kept"),
        ("revert", "activation_checkpointing reverted"),
        ("oom", "out of memory in aten.mm (asked for 2.00 GiB)"),
        ("exit", "OutOfMemoryError: CUDA (exit code 1)"),
    ]


def test_recorded_ddp_model_per_rank() -> None:
    state = load_state("ddp")
    zero, one = build_view_model(state, rank=0), build_view_model(state, rank=1)
    assert zero.world_size == 2 and zero.slowest_rank == 1
    advised = build_view_model(state, readvise=True)  # a finished session with no saved advice gets it too
    assert zero.diagnosis == advised.diagnosis
    assert advised.diagnosis.bottleneck == "communication"
    # those that fit the budget first (tests/test_recommend_recorded.py: the same advice)
    assert [r.id for r in advised.recommendations] == ["grad-accumulation", "grad-compression", "ddp-bucket"]
    assert zero.memory["peak_bytes"] == one.memory["peak_bytes"] == 11287104
    assert round(zero.compute["mfu"], 4) == 0.0615 and zero.ops[0]["name"] == "aten.sqrt"
    assert {row["rank"] for row in zero.collectives} == {0, 1}
    assert zero.straggler["rank"] == 0
    assert round(zero.peak_flops / zero.memory_bandwidth, 1) == 11.7  # the ridge, FLOP/byte


def test_recorded_oom_model_at_another_budget() -> None:
    state = load_state("oom")
    model = build_view_model(state, readvise=True)
    assert model.budget_bytes == 24_000_000  # the budget it was recorded with
    assert [r.id for r in model.recommendations] == ["checkpoint-blocks-4"]
    roomy = build_view_model(state, readvise=True, budget_bytes=1024**3)
    assert roomy.budget_bytes == 1024**3 and roomy.recommendations == []
    assert model.memory["oom"]["op"] == "aten.nll_loss_backward"
