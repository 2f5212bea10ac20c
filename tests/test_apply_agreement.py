"""Keep-or-revert agreed by all ranks: 2 gloo ranks, spawned, driving the real executor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ranks import free_port, spawn_ranks
from apply_scripts.agree import AT_STEP, worker

from advisor.apply.agreement import Agreement
from advisor.records.remedy import command_digest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]



def run(scenario: str, tmp_path: Path) -> list[dict]:
    folder = tmp_path / scenario
    folder.mkdir()
    spawn_ranks(worker, (2, free_port(), scenario, str(folder)), 2, [folder / f"rank{r}.json" for r in range(2)])
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> list[dict]:
    return run("none", tmp_path_factory.mktemp("agree"))


def test_a_failure_on_rank_1_only_reverts_both_and_losses_equal_an_undisturbed_run(tmp_path, undisturbed) -> None:
    ranks = run("fail_on_1", tmp_path)
    # Rank 0 applied a 10x learning rate; had it kept it for a single step, its losses would differ.
    for r in range(2):
        assert ranks[r]["losses"] == undisturbed[r]["losses"]
    [r0], [r1] = ranks[0]["results"], ranks[1]["results"]
    assert r1["status"] == "failed" and "injected failure" in r1["error"]
    assert r0["status"] == "reverted" and "another rank" in r0["reason"]
    assert r0["at_step"] == AT_STEP


def test_a_plan_entry_that_fails_on_rank_1_is_reverted_on_both(tmp_path, undisturbed) -> None:
    ranks = run("plan_fail_on_1", tmp_path)
    for r in range(2):
        assert ranks[r]["losses"] == undisturbed[r]["losses"]
    [r0], [r1] = ranks[0]["results"], ranks[1]["results"]
    assert r1["status"] == "failed" and r0["status"] == "reverted" and "another rank" in r0["reason"]


def test_both_ranks_keep_when_both_measure_it_fine(tmp_path) -> None:
    ranks = run("keep", tmp_path)
    assert [[r["status"] for r in rank["results"]] for rank in ranks] == [["kept"], ["kept"]]


def test_a_slowdown_seen_by_rank_1_only_reverts_both(tmp_path) -> None:
    ranks = run("slow_on_1", tmp_path)
    statuses = [[r["status"] for r in rank["results"]] for rank in ranks]
    assert statuses == [["reverted"], ["reverted"]]
    assert "another rank" in ranks[0]["results"][0]["reason"]
    assert "exceeds" in ranks[1]["results"][0]["reason"]


def test_a_rank_that_never_receives_the_command_makes_the_other_apply_nothing_after_the_timeout(tmp_path) -> None:
    ranks = run("absent_1", tmp_path)
    [r0] = ranks[0]["results"]
    assert r0["status"] == "failed" and "could not agree" in r0["reason"], r0
    assert "not every rank received the command" in r0["error"]
    assert ranks[1]["results"] == []
    assert len(ranks[0]["losses"]) == len(ranks[1]["losses"])  # training went on on both


def test_copies_that_arrive_at_different_boundaries_are_applied_at_one_and_kept(tmp_path, undisturbed) -> None:
    # The controller asked for step 1, already past; rank 0 saw the command at boundary 3, rank 1
    # at boundary 4. Applied where each saw it, the votes after the apply paired with DDP's
    # all-reduce of the other rank and hung both.
    ranks = run("late_on_1", tmp_path)
    [r0], [r1] = ranks[0]["results"], ranks[1]["results"]
    assert r0["status"] == r1["status"] == "kept", (r0, r1)
    assert r0["at_step"] == r1["at_step"] and r0["at_step"] > 4
    for r in range(2):  # factor 1.0: the same numerics as no apply at all
        assert ranks[r]["losses"] == undisturbed[r]["losses"]


def test_a_single_process_votes_alone() -> None:
    assert Agreement().vote(revert=True, digest=None).revert
    assert not Agreement().vote(revert=False, digest=command_digest("x", {}, 3)).revert


def test_the_digest_is_canonical() -> None:
    assert command_digest("r", {"a": 1, "b": [2]}, 5) == command_digest("r", {"b": [2], "a": 1}, 5)
    assert command_digest("r", {"a": 1}, 5) != command_digest("r", {"a": 1}, 6)
