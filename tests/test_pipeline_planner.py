"""The pipeline planner (recommend/remedies/pipeline.py): exact against brute force, the equal-layer
split beside it, the memory model of the two schedules, and the recommendation it makes."""

from __future__ import annotations

import itertools
import random

import pytest

from advisor.recommend.profile import ModuleProfile, Profile
from advisor.recommend.remedies.pipeline import PARAMS, propose_split, validate
from advisor.recommend.remedies.pipeline_planner import (
    PipeBlock,
    brute_force,
    equal_split,
    evaluate,
    min_max_partition,
    plan_pipeline,
)

GiB = 2**30


def _random_chain(rng: random.Random, n: int) -> list[PipeBlock]:
    return [
        PipeBlock(name=f"blocks.{i}", forward_s=rng.uniform(0.1, 2.0), backward_s=rng.uniform(0.1, 4.0),
                  activation_bytes=rng.randint(1, 400), parameter_bytes=rng.randint(1, 100),
                  optimizer_bytes=rng.randint(0, 200), output_bytes=rng.randint(1, 50))
        for i in range(n)
    ]


def test_dp_is_exact_against_brute_force_on_random_chains() -> None:
    rng = random.Random(12)
    checked = feasible = 0
    for _ in range(60):
        n = rng.randint(2, 9)
        p = rng.randint(1, min(n, 4))
        blocks = _random_chain(rng, n)
        bandwidth = rng.choice([10.0, 100.0, 1e9])
        total = sum(2 * b.parameter_bytes + b.optimizer_bytes + b.activation_bytes for b in blocks)
        memory = rng.choice([None, total / p * rng.uniform(0.6, 1.6)])
        extra = [rng.randint(0, 50) for _ in range(p)]
        for schedule, m in itertools.product(("gpipe", "1f1b"), (1, 2, 5)):
            kw = dict(micro_batches=m, schedule=schedule, memory_bytes=memory, bandwidth_bytes_s=bandwidth,
                      extra_bytes=extra)
            bounds = min_max_partition(blocks, p, **kw)
            brute = brute_force(blocks, p, **kw)
            checked += 1
            if brute is None:
                assert bounds is None
                continue
            feasible += 1
            ours = evaluate(blocks, bounds, **kw)
            assert ours.feasible
            assert max(ours.stage_time_s) == pytest.approx(max(brute.stage_time_s), rel=1e-12)
    assert feasible > checked // 3 and feasible < checked  # both outcomes were exercised


def test_plan_picks_the_fastest_feasible_schedule_and_m_like_brute_force() -> None:
    rng = random.Random(3)
    for _ in range(20):
        n, p = rng.randint(3, 8), rng.randint(2, 3)
        blocks = _random_chain(rng, n)
        memory = sum(2 * b.parameter_bytes + b.optimizer_bytes + b.activation_bytes for b in blocks) / p
        plan = plan_pipeline(blocks, stages=p, memory_bytes=memory, bandwidth_bytes_s=100.0, micro_batches=[1, 2, 4, 8])
        options = [brute_force(blocks, p, micro_batches=m, schedule=s, memory_bytes=memory, bandwidth_bytes_s=100.0)
                   for s in ("gpipe", "1f1b") for m in (1, 2, 4, 8)]
        options = [o for o in options if o is not None]
        if not options:
            assert not plan.best.feasible
            continue
        assert plan.best.feasible
        assert plan.best.step_time_s == pytest.approx(min(o.step_time_s for o in options), rel=1e-12)


def test_unbalanced_chain_beats_equal_layer_split_by_the_predicted_margin() -> None:
    # Six light blocks then two blocks six times as heavy: the equal split puts both heavy
    # blocks on the last of three stages (12 against 3 and 3); the balanced one is 6, 6, 6.
    costs = [1.0] * 6 + [6.0, 6.0]
    blocks = [PipeBlock(name=f"blocks.{i}", forward_s=c / 3, backward_s=2 * c / 3, activation_bytes=100,
                        parameter_bytes=10, optimizer_bytes=20, output_bytes=8) for i, c in enumerate(costs)]
    plan = plan_pipeline(blocks, stages=3, bandwidth_bytes_s=1e12, micro_batches=[4], schedules=("gpipe",))
    best, naive = plan.best, plan.naive
    assert best.bounds == (0, 6, 7, 8)
    assert naive.bounds == equal_split(8, 3) == (0, 3, 6, 8)
    assert max(naive.stage_time_s) == pytest.approx(12.0)
    assert max(best.stage_time_s) == pytest.approx(6.0, rel=1e-9)
    assert naive.imbalance == pytest.approx(2.0, rel=1e-9) and best.imbalance == pytest.approx(1.0, rel=1e-9)
    # Step = (m + p - 1)/m * slowest stage; the bubble (p-1)/(m+p-1) is the same for both.
    assert best.step_time_s == pytest.approx(6 * 6.0 / 4, rel=1e-9)
    assert naive.step_time_s / best.step_time_s == pytest.approx(2.0, rel=1e-9)
    assert best.bubble_fraction == pytest.approx(2 / 6)
    assert best.p2p_bytes == naive.p2p_bytes == 2 * 2 * 8  # two boundaries, activation and its gradient
    assert plan.serial_step_s == pytest.approx(18.0)


def test_gpipe_keeps_m_micro_batches_and_1f1b_at_most_p() -> None:
    blocks = [PipeBlock(name=f"b.{i}", forward_s=1, backward_s=1, activation_bytes=800, parameter_bytes=10,
                        optimizer_bytes=20, output_bytes=80) for i in range(4)]
    bounds = (0, 2, 4)
    g = evaluate(blocks, bounds, micro_batches=8, schedule="gpipe")
    f = evaluate(blocks, bounds, micro_batches=8, schedule="1f1b")
    states = 2 * 20 + 40
    # GPipe: all 8 micro-batches of 1600/8 bytes (stage 1 also keeps the 80/8 it receives of
    # each); 1F1B: stage 0 keeps p=2, stage 1 keeps 1.
    assert g.peak_bytes == (states + 1600 + 10, states + 1600 + 80 + 10)
    assert f.peak_bytes == (states + 2 * 200 + 10, states + 1 * (200 + 10) + 10)
    # Under a limit only 1F1B fits, so the plan takes it; GPipe alone cannot fit at all.
    plan = plan_pipeline(blocks, stages=2, memory_bytes=1000, micro_batches=[8])
    assert plan.best.feasible and plan.best.schedule == "1f1b"
    only = plan_pipeline(blocks, stages=2, memory_bytes=1000, micro_batches=[8], schedules=("gpipe",))
    assert not only.best.feasible


def test_bad_input_is_refused_with_the_valid_range() -> None:
    blocks = _random_chain(random.Random(0), 3)
    with pytest.raises(ValueError, match="valid: 1..3"):
        plan_pipeline(blocks, stages=4)
    with pytest.raises(ValueError, match="valid: gpipe, 1f1b"):
        plan_pipeline(blocks, stages=2, schedules=("zb",))
    with pytest.raises(ValueError, match="contiguous"):
        evaluate(blocks, (0, 2, 2, 3), micro_batches=1, schedule="gpipe")


def _profile(budget: int) -> Profile:
    blocks = []
    for i, scale in enumerate([1, 1, 1, 1, 1, 1, 3, 3]):
        blocks.append(ModuleProfile(name=f"blocks.{i}", type="Block", depth=2, parameter_bytes=GiB // 4,
                                    activation_bytes=scale * GiB // 2, input_bytes=2**24, output_bytes=2**24,
                                    forward_s=0.01 * scale, backward_s=0.02 * scale))
    root = ModuleProfile(name="", type="GPT", depth=0, parameter_bytes=3 * GiB, activation_bytes=GiB // 2,
                         forward_s=0.2, backward_s=0.4)
    return Profile(peak_bytes=20 * GiB, budget_bytes=budget,
                   categories_at_peak={"parameter": 3 * GiB, "gradient": 3 * GiB, "optimizer_state": 6 * GiB,
                                       "activation": 8 * GiB},
                   modules=(root, *blocks), step_time_s=0.7)


def test_propose_live_split_for_one_process_that_does_not_fit_one_device() -> None:
    recs = propose_split(_profile(16 * GiB), None, devices=2).recommendations
    assert len(recs) == 1
    rec = recs[0]
    assert rec.remedy == "pipeline" and rec.live and not rec.exact
    assert set(rec.params) == set(PARAMS)
    validate(rec.params)
    stages = rec.params["stages"]
    assert [n for s in stages for n in s] == [f"blocks.{i}" for i in range(8)]
    assert rec.params["devices"] == ["cuda:0", "cuda:1"]
    assert rec.predicted.peak_memory_bytes <= 16 * GiB < rec.baseline.peak_memory_bytes
    assert any("equal-layer split" in e for e in rec.evidence)
    # The heavy blocks go to the second stage on their own (6 light = 2 heavy in time).
    assert stages == [[f"blocks.{i}" for i in range(6)], ["blocks.6", "blocks.7"]]


def test_propose_restart_for_multi_rank_with_split_points_and_loop() -> None:
    recs = propose_split(_profile(16 * GiB), None, devices=1, world_size=2).recommendations
    assert len(recs) == 1 and not recs[0].live
    params = recs[0].params
    assert params["split_points"] == [params["stages"][1][0]]
    loop = params["loop_change"]
    assert f'"{params["split_points"][0]}": SplitPoint.BEGINNING' in loop
    assert "schedule.step(x)" in loop and "schedule.step(target=y, losses=losses)" in loop


def test_propose_nothing_with_one_device_or_when_it_fits_and_is_slower() -> None:
    one = propose_split(_profile(16 * GiB), None, devices=1)
    assert one.recommendations == () and "not proposed" in str(one.evidence[-1].value)
    # Fits one device and the split, with its bubble and the slow assumed link, is not faster.
    assert propose_split(_profile(64 * GiB), None, devices=2, link_bytes_s=1e6).recommendations == ()


@pytest.mark.parametrize("params, message", [
    ({"stages": [["a"]], "micro_batches": 2, "devices": ["cpu"]}, "two or more"),
    ({"stages": [["a"], ["a"]], "micro_batches": 2, "devices": ["cpu", "cpu"]}, "twice"),
    ({"stages": [["a"], ["b"]], "micro_batches": 0, "devices": ["cpu", "cpu"]}, "micro_batches"),
    ({"stages": [["a"], ["b"]], "micro_batches": 2, "devices": ["cpu"]}, "one device string per stage"),
])
def test_validate_names_what_is_wrong(params: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate(params)
