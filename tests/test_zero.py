"""ZeRO-1 switched live on 2 gloo ranks: same losses bit for bit, state split by the formula,
revert restores the replicated optimizer (issue 11)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from apply_scripts.zero_switch import worker

from advisor.apply.remedies.zero import partition

pytestmark = pytest.mark.timeout(180)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(scenario: str, tmp_path: Path) -> list[dict]:
    folder = tmp_path / scenario
    folder.mkdir()
    mp.spawn(worker, args=(2, _free_port(), scenario, str(folder)), nprocs=2)
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


def test_partition_balances_by_size_and_is_deterministic() -> None:
    owners = partition([100, 10, 60, 50, 5], 2)
    loads = [sum(s for s, o in zip([100, 10, 60, 50, 5], owners) if o == r) for r in range(2)]
    assert owners == [0, 0, 1, 1, 0] and loads == [115, 110]
    assert partition([4, 4, 4, 4], 4) == [0, 1, 2, 3]
