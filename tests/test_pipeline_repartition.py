"""Repartition of a live pipeline (issue 12, the rule's second part): a new split from measured
per-stage times (calibrated DP, against brute force), applied live by moving blocks between stages
with the losses kept, reverted to the previous split, and atomic on a failure mid-move."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch import nn

from advisor.apply.remedies import pipeline as pipeline_mod
from advisor.apply.remedies.pipeline import PipelineHandle, RepartitionHandle, apply_pipeline
from advisor.recommend.remedies.pipeline_planner import PipeBlock, brute_force, evaluate
from advisor.recommend.remedies.pipeline_repartition import (
    IMBALANCE,
    bounds_of,
    calibrate,
    propose_repartition,
    repartition,
)
from pipeline_models import Target, train_gpt

FIRST = [["blocks.0"], ["blocks.1", "blocks.2", "blocks.3"]]
SECOND = [["blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]]


def _close(a: list[float], b: list[float], rel: float = 1e-5) -> None:
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) <= rel * abs(x), f"step {step}: {x!r} vs {y!r}"


@pytest.fixture(scope="module")
def gpt_baseline() -> list[float]:
    return train_gpt(20)


def test_repartition_live_keeps_the_losses_and_reverts_to_the_previous_split(gpt_baseline, monkeypatch) -> None:
    moved: list[tuple[nn.Module, torch.device]] = []
    real = pipeline_mod._move_module
    monkeypatch.setattr(pipeline_mod, "_move_module",
                        lambda h, b, d, s: (moved.append((b, d)), real(h, b, d, s))[1])
    handles: list[Any] = []
    seen: dict[str, Any] = {}
    reports: list[dict[str, Any]] = []

    def at(i: int, target: Target) -> None:
        if i == 2:
            target.notify = lambda name, data: reports.append(data) if name == "pipeline_stages" else None
            handles.append(apply_pipeline(target, stages=FIRST, micro_batches=4, devices=["cpu", "cpu"]))
        if i == 12:
            pipe = handles[0]
            seen["times"] = pipe.stage_times()
            moved.clear()
            handles.append(apply_pipeline(target, stages=SECOND, micro_batches=2, devices=["cpu", "cpu"]))
            blocks = target.models[0].blocks
            assert [b for b, _ in moved] == [blocks[1]]  # only the block whose stage changed moved
            assert [s for _, _, s in pipe._blocks] == [0, 0, 1, 1] and pipe.micro_batches == 2
        if i == 16:
            seen["new_times"] = handles[0].stage_times()
            handles[1].revert()
            handles[1].revert()  # twice is harmless
            assert [s for _, _, s in handles[0]._blocks] == [0, 1, 1, 1] and handles[0].micro_batches == 4
        if i == 18:
            handles[0].revert()

    losses = train_gpt(20, at)
    _close(gpt_baseline, losses)
    pipe, again = handles
    assert isinstance(pipe, PipelineHandle) and isinstance(again, RepartitionHandle)
    assert pipe.mode == "reverted"
    # What the controller hears: the split's times every REPORT_EVERY pipelined forwards, a report
    # with no times right after each change of split, and the end of the split.
    assert reports[0]["mode"] == "pipeline" and reports[0]["stages"] == FIRST
    assert len(reports[0]["stage_times_s"]) == 2 and min(reports[0]["stage_times_s"]) > 0
    assert reports[1]["stages"] == SECOND and reports[1]["stage_times_s"] == [0.0, 0.0]
    assert reports[-1]["mode"] == "reverted"
    # Per-stage forward seconds from the timeline: every stage worked in both splits.
    assert len(seen["times"]) == 2 and all(t > 0 for t in seen["times"] + seen["new_times"])


def test_failure_mid_repartition_leaves_the_split_as_it_was(gpt_baseline, monkeypatch) -> None:
    real = pipeline_mod._move_module
    state = {"armed": False}

    def failing(handle: PipelineHandle, block: nn.Module, device: torch.device, states: Any) -> None:
        if state["armed"]:
            state["armed"] = False
            raise RuntimeError("injected: a move failed")
        real(handle, block, device, states)

    monkeypatch.setattr(pipeline_mod, "_move_module", failing)
    handles: list[PipelineHandle] = []
    errors: list[BaseException] = []

    def at(i: int, target: Target) -> None:
        if i == 5:
            handles.append(apply_pipeline(target, stages=FIRST, micro_batches=4, devices=["cpu", "cpu"]))
        if i == 8:
            state["armed"] = True
            try:
                apply_pipeline(target, stages=SECOND, micro_batches=2, devices=["cpu", "cpu"])
            except RuntimeError as exc:
                errors.append(exc)
            assert handles[0].stages == tuple(tuple(s) for s in FIRST) and handles[0].micro_batches == 4
            assert [s for _, _, s in handles[0]._blocks] == [0, 1, 1, 1]

    losses = train_gpt(20, at)
    assert len(errors) == 1 and "injected" in str(errors[0])
    _close(gpt_baseline, losses)
    assert handles[0].mode == "pipeline"


def test_another_chain_over_pipelined_blocks_is_refused(gpt_baseline) -> None:
    def at(i: int, target: Target) -> None:
        if i == 2:
            apply_pipeline(target, stages=FIRST, micro_batches=2, devices=["cpu", "cpu"])
            with pytest.raises(ValueError, match="already pipelined"):
                apply_pipeline(target, stages=[["blocks.1"], ["blocks.2"]], micro_batches=2, devices=["cpu", "cpu"])

    train_gpt(4, at)


def _blocks(times: list[float]) -> list[PipeBlock]:
    return [PipeBlock(name=f"blocks.{i}", forward_s=t, backward_s=2 * t, activation_bytes=100, parameter_bytes=10,
                      optimizer_bytes=20, output_bytes=50) for i, t in enumerate(times)]


def test_calibration_makes_the_model_agree_with_the_measured_stage_times() -> None:
    blocks = _blocks([1.0, 1.0, 1.0, 1.0])
    bounds = bounds_of(blocks, [["blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]])
    fitted = calibrate(blocks, bounds, [6.0, 2.0])  # stage 0's device is three times slower
    assert [b.forward_s for b in fitted] == [3.0, 3.0, 1.0, 1.0]
    assert [b.backward_s for b in fitted] == [6.0, 6.0, 2.0, 2.0]


def test_repartition_on_measured_times_matches_brute_force() -> None:
    rng = random.Random(5)  # private generator
    for _ in range(60):
        n, p = rng.randint(3, 8), rng.randint(2, 3)
        if p > n:
            continue
        blocks = _blocks([rng.uniform(0.5, 2.0) for _ in range(n)])
        cut = sorted(rng.sample(range(1, n), p - 1))
        bounds = (0, *cut, n)
        stages = [[b.name for b in blocks[bounds[s]:bounds[s + 1]]] for s in range(p)]
        measured = [rng.uniform(0.5, 5.0) for _ in range(p)]
        plan = repartition(blocks, stages, measured, micro_batches=4, bandwidth_bytes_s=1e3)
        fitted = calibrate(blocks, bounds, measured)
        best = brute_force(fitted, p, micro_batches=4, schedule="gpipe", bandwidth_bytes_s=1e3)
        assert max(plan.proposed.stage_time_s) == pytest.approx(max(best.stage_time_s))
        assert plan.proposed.step_time_s <= plan.current.step_time_s + 1e-12


def test_an_imbalanced_pipeline_is_rebalanced_with_its_predicted_gain() -> None:
    blocks = _blocks([1.0] * 6)
    stages = [["blocks.0", "blocks.1", "blocks.2"], ["blocks.3", "blocks.4", "blocks.5"]]
    # Stage 0 measured at twice its blocks' sum: its blocks are heavier than planned, so it holds fewer.
    (rec,) = propose_repartition(blocks, stages, [6.0, 3.0], micro_batches=4, devices=["cuda:0", "cuda:1"],
                                 bandwidth_bytes_s=1e12).recommendations
    assert rec.apply_class == "live-equivalent" and rec.live and rec.remedy == "pipeline"
    assert rec.params["stages"] == [["blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "blocks.4", "blocks.5"]]
    fitted = calibrate(blocks, (0, 3, 6), [6.0, 3.0])
    new = evaluate(fitted, (0, 2, 6), micro_batches=4, schedule="gpipe", bandwidth_bytes_s=1e12)
    old = evaluate(fitted, (0, 3, 6), micro_batches=4, schedule="gpipe", bandwidth_bytes_s=1e12)
    assert rec.predicted.step_time_s == pytest.approx(new.step_time_s)
    # Calibrated compute (forward + backward) per block: 6 6 6 | 3 3 3; the slowest stage goes 18 -> 15.
    assert rec.baseline.step_time_s is None and "17% faster" in rec.title
    assert old.step_time_s / new.step_time_s == pytest.approx(18 / 15)
    # A multi-rank job gets the restart form with the new split points and loop.
    (multi,) = propose_repartition(blocks, stages, [6.0, 3.0], micro_batches=4, world_size=2,
                                   bandwidth_bytes_s=1e12).recommendations
    assert multi.apply_class == "restart" and multi.params["split_points"] == ["blocks.2"]
    assert "schedule.step" in multi.params["loop_change"]


def test_a_balanced_pipeline_is_left_alone() -> None:
    stages = [["blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]]
    proposal = propose_repartition(_blocks([1.0] * 4), stages, [2.0, 2.1], micro_batches=4,
                                   devices=["cuda:0", "cuda:1"])
    assert proposal.recommendations == ()
    assert proposal.evidence[0].threshold == IMBALANCE and proposal.evidence[0].value < IMBALANCE


def test_the_rule_rebalances_a_reported_split_and_ignores_a_reverted_one() -> None:
    """A ``pipeline_stages`` event in the session: the profile carries the live split and the
    advice includes its repartition; once the split is reverted, nothing is proposed."""
    from dataclasses import replace

    import recorded
    from test_recommend_recorded import profile_of

    from advisor.recommend.advise import advise
    from advisor.recommend.profile import profile_from_records
    from advisor.records.events import PipelineStages
    from advisor.records.samples import Event

    split = {"stages": [["blocks.0", "blocks.1", "blocks.2"], ["blocks.3"]], "devices": ["cuda:0", "cuda:1"],
             "micro_batches": 4, "mode": "pipeline", "stage_times_s": [0.3, 0.1]}
    live = profile_from_records(steps=[], memory=[], modules=[], ops=[], collectives=[],
                                events=[Event(name="pipeline_stages", data=split)], runs=[], models=[], optimizers=[])
    assert live.pipeline == PipelineStages.from_dict(split)
    gone = profile_from_records(steps=[], memory=[], modules=[], ops=[], collectives=[], runs=[], models=[],
                                optimizers=[], events=[Event(name="pipeline_stages", data=split),
                                                       Event(name="pipeline_stages", data={**split, "mode": "reverted"})])
    assert gone.pipeline is None
    profile = replace(profile_of(recorded.load_state("gpt")), pipeline=PipelineStages.from_dict(split))
    _, recs = advise(profile)
    rec = next(r for r in recs if r.id.startswith("pipeline-repartition"))
    assert rec.live and rec.params["devices"] == split["devices"] and rec.params["micro_batches"] == 4
    assert len(rec.params["stages"][0]) < 3  # the slow first stage gives up blocks
    _, recs = advise(replace(profile, pipeline=None))
    assert not any(r.id.startswith("pipeline-repartition") for r in recs)
