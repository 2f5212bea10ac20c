"""The report's ``zero`` section: the ZeRO stage in force on each rank, from the records alone."""

from __future__ import annotations

from dataclasses import replace

from advisor.records.results import ApplyResult, Measurement, RevertResult
from advisor.records.samples import ModelInfo, OptimizerInfo, RunInfo
from advisor.sections.zero import build_zero_section
from advisor.state import SessionState


def state(wrapper: str | None = "DistributedDataParallel", optimizer: str = "AdamW", world: int = 2) -> SessionState:
    s = SessionState()
    for r in range(world):
        s.runs[r] = RunInfo(script="train.py", argv=[], rank=r, world_size=world)
        s.models.append(ModelInfo(rank=r, name="MLP", wrapper=wrapper))
        s.optimizers.append(OptimizerInfo(rank=r, name=optimizer))
    return s


def result(rank: int, stage: int, status: str, at_step: int, peak: int = 100) -> ApplyResult:
    return ApplyResult(remedy="zero", recommendation_id=f"zero-{stage}", params={"stage": stage}, rank=rank,
                       at_step=at_step, status=status, predicted=Measurement(peak_memory_bytes=peak),
                       after=Measurement(peak_memory_bytes=peak + 7, step_time_s=0.5))


def stages(s: SessionState) -> list[int | None]:
    return [e["stage"] for e in build_zero_section(s)]


def test_the_script_sets_the_stage_before_any_apply() -> None:
    assert stages(state()) == [0, 0]
    assert stages(state(optimizer="ZeroRedundancyOptimizer")) == [1, 1]
    assert stages(state(wrapper="fully_shard")) == [3, 3]
    assert stages(state(wrapper=None)) == [None, None]
    assert build_zero_section(state(world=1)) == []


def test_a_kept_apply_sets_the_stage_with_its_predicted_and_measured_figures() -> None:
    s = state()
    s.applied += [result(0, 3, "kept", 5), result(1, 3, "kept", 5)]
    [r0, r1] = build_zero_section(s)
    assert (r0["stage"], r0["since_step"], r0["source"], r0["recommendation_id"]) == (3, 5, "applied", "zero-3")
    assert r1["rank"] == 1 and r1["stage"] == 3
    assert r0["predicted"]["peak_memory_bytes"] == 100 and r0["measured"]["peak_memory_bytes"] == 107


def test_a_reverted_apply_leaves_the_stage_and_a_user_revert_restores_the_one_before() -> None:
    s = state()
    s.applied += [result(0, 2, "reverted", 3), result(1, 2, "reverted", 3)]  # reverted by the window's vote
    assert stages(s) == [0, 0]
    s.applied += [result(0, 3, "kept", 5), result(1, 3, "kept", 5), result(0, 2, "kept", 9), result(1, 2, "kept", 9)]
    assert stages(s) == [2, 2]
    revert = RevertResult(remedy="zero", recommendation_id="zero-2", at_step=12)
    s.applied.append(revert)  # rank 0's event (the events name no rank)
    assert stages(s) == [3, 2]
    s.applied.append(revert)  # rank 1's
    assert stages(s) == [3, 3]


def test_other_remedies_do_not_change_the_stage() -> None:
    s = state()
    s.applied.append(replace(result(0, 3, "kept", 5), remedy="activation_checkpointing"))
    assert stages(s) == [0, 0]
