"""ZeRO-1 switched live on 2 gloo ranks: same losses bit for bit, state split by the formula,
revert restores the replicated optimizer (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ranks import free_port, spawn_ranks
from apply_scripts.zero_switch import worker

from advisor.apply.remedies.zero import partition

pytestmark = pytest.mark.timeout(180)



def run(scenario: str, tmp_path: Path) -> list[dict]:
    folder = tmp_path / scenario
    folder.mkdir()
    spawn_ranks(worker, (2, free_port(), scenario, str(folder)), 2, [folder / f"rank{r}.json" for r in range(2)])
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> list[dict]:
    return run("none", tmp_path_factory.mktemp("zero"))


@pytest.mark.slow
def test_zero1_keeps_every_loss_bit_for_bit_and_splits_the_state(undisturbed, tmp_path) -> None:
    ranks = run("switch", tmp_path)
    for r in range(2):
        assert ranks[r]["losses"] == undisturbed[r]["losses"]
        assert ranks[r]["params"] == undisturbed[r]["params"]
        # AdamW keeps exp_avg and exp_avg_sq (2x the parameter bytes) for the parameters it owns,
        # plus a 4-byte step counter each.
        owned = ranks[r]["owned_param_bytes"]
        n_owned = sum(1 for o in ranks[r]["owners"] if o == r)
        assert ranks[r]["state_bytes_after_switch"] == 2 * owned + 4 * n_owned
    total = sum(rk["owned_param_bytes"] for rk in ranks)
    assert total * 2 == ranks[0]["full_state_bytes"]
    assert ranks[0]["owners"] == ranks[1]["owners"]  # every rank computed the same partition


@pytest.mark.slow
def test_revert_restores_the_whole_state_and_the_losses_stay_equal(undisturbed, tmp_path) -> None:
    ranks = run("switch_revert", tmp_path)
    for r in range(2):
        assert ranks[r]["losses"] == undisturbed[r]["losses"]
        assert ranks[r]["params"] == undisturbed[r]["params"]
        n = len(ranks[r]["owners"])
        assert ranks[r]["state_bytes_after_revert"] == ranks[r]["full_state_bytes"] + 4 * n


@pytest.mark.slow
def test_a_revert_before_the_first_step_is_local_and_exact(undisturbed, tmp_path) -> None:
    ranks = run("revert_before_step", tmp_path)
    for r in range(2):
        assert ranks[r]["losses"] == undisturbed[r]["losses"]


@pytest.mark.slow
def test_a_failed_switch_on_one_rank_reverts_both_without_a_hang(undisturbed, tmp_path) -> None:
    ranks = run("executor_fail_on_1", tmp_path)
    for r in range(2):
        assert ranks[r]["losses"] == undisturbed[r]["losses"]
        assert ranks[r]["state_bytes_end"] == ranks[r]["full_state_bytes"] + 4 * len(ranks[r]["params"])
    [r0], [r1] = ranks[0]["results"], ranks[1]["results"]
    assert r1["status"] == "failed" and "injected failure" in r1["error"]
    assert r0["status"] == "reverted" and "another rank" in r0["reason"]


def test_partition_balances_by_size_and_is_deterministic() -> None:
    owners = partition([100, 10, 60, 50, 5], 2)
    loads = [sum(s for s, o in zip([100, 10, 60, 50, 5], owners) if o == r) for r in range(2)]
    assert owners == [0, 0, 1, 1, 0] and loads == [115, 110]
    assert partition([4, 4, 4, 4], 4) == [0, 1, 2, 3]


def _profile(**kw):
    from advisor.recommend.profile import Profile
    from advisor.records.samples import CollectiveStat

    base = dict(peak_bytes=1000, budget_bytes=700, step_time_s=0.2, world_size=2,
                data_parallel="DistributedDataParallel", optimizer_count=1,
                categories_at_peak={"parameter": 200, "gradient": 200, "optimizer_state": 400, "activation": 150,
                                    "temporary": 50, "input": 0, "other": 0},
                collectives=(CollectiveStat(step=1, op="all_reduce", group_size=2, bytes=100_000_000, time_s=0.1),))
    base.update(kw)
    return Profile(**base)


def test_zero1_prediction_follows_the_formulas() -> None:
    from advisor.recommend.remedies.zero import propose

    [rec] = propose(_profile(), 700, [])
    # optimizer state 400 B over 2 ranks: 200 B less at the peak
    assert rec.predicted.peak_memory_bytes == 800 and rec.baseline.peak_memory_bytes == 1000
    # all-reduce of 1e8 B in 0.1 s on 2 ranks: bus bandwidth 1e9 * 2(n-1)/n = 1e9 B/s;
    # the owners broadcast 200 B of parameters after each step: +2e-7 s
    assert rec.predicted.step_time_s == pytest.approx(0.2 + 200 / 1e9)
    assert rec.apply_class == "live-exact" and rec.params == {"stage": 1} and not rec.fits


def test_zero1_is_not_proposed_where_it_cannot_apply() -> None:
    from advisor.recommend.remedies.zero import propose

    assert propose(_profile(world_size=1), 700, []) == []
    assert propose(_profile(data_parallel=None), 700, []) == []
    evidence: list = []
    assert propose(_profile(optimizer_count=2), 700, evidence) == []
    assert "2 optimizers" in evidence[0]["value"]


def test_the_memory_rule_proposes_zero_when_model_states_dominate() -> None:
    from advisor.recommend.advise import advise

    diagnosis, recs = advise(_profile(budget_bytes=850))
    assert diagnosis.bottleneck == "memory"
    zero = [r for r in recs if r.remedy == "zero"]
    assert zero and zero[0].fits and zero[0].predicted.peak_memory_bytes == 800


def test_stage_validation_names_the_built_stages() -> None:
    from advisor.recommend.remedies import check_params

    check_params("zero", {"stage": 1})
    with pytest.raises(ValueError, match=r"valid: \[1\]"):
        check_params("zero", {"stage": 3})


def test_zero1_prediction_bounds_the_busiest_rank_and_counts_the_smaller_optimizer_step() -> None:
    from advisor.recommend.profile import ModuleProfile
    from advisor.recommend.remedies.zero import propose

    modules = (ModuleProfile(name="", parameter_bytes=200), ModuleProfile(name="a", parameter_bytes=60),
               ModuleProfile(name="b", parameter_bytes=40))
    [rec] = propose(_profile(modules=modules, phases={"optimizer_s": 0.08}), 950, [])
    # half of the 400 B state is saved, less the state of the largest parameter (60/200 of it)
    assert rec.predicted.peak_memory_bytes == 1000 - (200 - 120)
    assert rec.predicted.step_time_s == pytest.approx(0.2 - 0.04 + 200 / 1e9)


def test_zero1_is_not_proposed_when_one_parameter_holds_most_of_the_state() -> None:
    from advisor.recommend.profile import ModuleProfile
    from advisor.recommend.remedies.zero import propose

    modules = (ModuleProfile(name="a", parameter_bytes=150), ModuleProfile(name="b", parameter_bytes=50))
    evidence: list = []
    assert propose(_profile(modules=modules), 700, evidence) == []
    assert "largest parameter" in evidence[0]["value"]
