"""ZeRO-2 and ZeRO-3 (FSDP2) switched live on a DDP job of 2 gloo ranks (issue 11).

Apply class: ``live-equivalent``. Two things may reassociate floating-point sums against the
DDP run: FSDP2 reduce-scatters where DDP all-reduces (the same sum of two addends on 2 ranks,
but another order on more ranks or with NCCL's ring), and ``clip_grad_norm_`` on DTensor
gradients sums the squares shard by shard before the all-reduce. So the losses are held to
1e-6 relative, the issue's bound (on this machine they came out bit-identical).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from apply_scripts.zero_switch import worker
from ranks import free_port, spawn_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

WORLD = 2
REL = 1e-6


def run(scenario: str, tmp_path: Path) -> list[dict]:
    folder = tmp_path / scenario.replace(":", "_")
    folder.mkdir()
    spawn_ranks(worker, (WORLD, free_port(), scenario, str(folder)), WORLD,
                [folder / f"rank{r}.json" for r in range(WORLD)])
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> dict[str, list[dict]]:
    """The unswitched run of each model, computed once."""
    cache: dict[str, list[dict]] = {}
    root = tmp_path_factory.mktemp("zero_fsdp")

    def get(model: str) -> list[dict]:
        if model not in cache:
            cache[model] = run(f"none:1:{model}", root)
        return cache[model]

    return get  # type: ignore[return-value]


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=REL, abs_tol=1e-9) for x, y in zip(a, b))


def assert_same_training(got: list[dict], base: list[dict]) -> None:
    for r in range(WORLD):
        assert close(got[r]["losses"], base[r]["losses"]), (got[r]["losses"], base[r]["losses"])
        for p, q in zip(got[r]["params"], base[r]["params"]):
            assert close(p, q)


def local_rows(dim0: int, rank: int, world: int) -> int:
    """Rows of dim 0 that rank ``rank`` holds under ``Shard(0)``: ``torch.chunk`` semantics
    (chunks of ceil(dim0 / world) rows, the last ones shorter or empty)."""
    size = -(-dim0 // world)
    return max(0, min(size, dim0 - rank * size))


def shard_bytes(shapes: list[list[int]], rank: int) -> int:
    total = 0
    for shape in shapes:
        rest = math.prod(shape[1:])
        total += local_rows(shape[0], rank, WORLD) * rest * 4  # fp32
    return total


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("model", ["", "mlp"])
def test_switch_keeps_the_losses_and_shards_every_model_state_by_the_formula(undisturbed, tmp_path, stage, model):
    got = run(f"switch:{stage}:{model}", tmp_path)
    assert_same_training(got, undisturbed(model))
    for r in range(WORLD):
        rank = got[r]
        own = shard_bytes(rank["shapes"], r)
        # Parameters and gradients: this rank's Shard(0) rows only; AdamW's exp_avg and exp_avg_sq
        # are sharded like the parameter, its 4-byte step counter is not.
        assert rank["param_bytes_after_switch"] == own
        assert rank["grad_bytes_after_switch"] == own
        assert rank["state_bytes_after_switch"] == 2 * own + 4 * len(rank["shapes"])
        assert rank["old_storage_bytes"] == 0  # the replicated parameters were freed at commit
        assert rank["reshard_after_forward"] is (stage == 3)
        assert rank["sharded_at_end"]
    assert sum(shard_bytes(got[0]["shapes"], r) for r in range(WORLD)) * 2 == got[0]["full_state_bytes"]


@pytest.mark.parametrize("stage", [2, 3])
def test_revert_brings_ddp_back_with_the_whole_state_and_the_losses_stay_equal(undisturbed, tmp_path, stage):
    got = run(f"switch_revert:{stage}:mlp", tmp_path)
    assert_same_training(got, undisturbed("mlp"))
    for rank in got:
        assert not rank["sharded_at_end"]
        assert rank["state_bytes_after_revert"] == rank["full_state_bytes"] + 4 * len(rank["shapes"])


@pytest.mark.parametrize("stage", [2, 3])
def test_a_joint_plan_of_the_stage_and_checkpointing_keeps_the_losses_and_reverts_whole(undisturbed, tmp_path, stage):
    """Issue 33: checkpointing patched first (whatever order the plan lists), FSDP2 wraps the
    patched blocks, training matches DDP's to 1e-6, and one revert undoes both parts."""
    got = run(f"joint_revert:{stage}:mlp", tmp_path)
    assert_same_training(got, undisturbed("mlp"))
    for rank in got:
        assert rank["order"] == ["activation_checkpointing", "zero"]
        assert rank["checkpointed_in_force"] == [True, False, True]
        assert rank["checkpointed_after_revert"] == 0 and not rank["sharded_at_end"]
        assert rank["state_bytes_after_revert"] == rank["full_state_bytes"] + 4 * len(rank["shapes"])


def test_zero3_to_zero2_and_back_on_the_sharded_model(undisturbed, tmp_path):
    got = run("restage:3:mlp", tmp_path)
    assert_same_training(got, undisturbed("mlp"))
    for rank in got:
        assert rank["reshard_after_restage"] is False and rank["reshard_after_restage_revert"] is True


def test_a_revert_at_the_apply_boundary_is_local_and_exact(undisturbed, tmp_path):
    got = run("revert_before_step:3", tmp_path)
    for r in range(WORLD):
        assert got[r]["losses"] == undisturbed("")[r]["losses"]
        assert got[r]["state_bytes_end"] == got[r]["full_state_bytes"] + 4 * len(got[r]["shapes"])


@pytest.mark.parametrize("stage", [2, 3])
def test_a_failed_switch_on_one_rank_reverts_both_without_a_hang(undisturbed, tmp_path, stage):
    got = run(f"executor_fail_on_1:{stage}", tmp_path)
    for r in range(WORLD):
        assert got[r]["losses"] == undisturbed("")[r]["losses"]
        assert not got[r]["sharded_at_end"]
    [r0], [r1] = got[0]["results"], got[1]["results"]
    assert r1["status"] == "failed" and "injected failure" in r1["error"]
    assert r0["status"] == "reverted" and "another rank" in r0["reason"]


def test_a_revert_after_an_evaluation_forward_under_zero2_restores_everything(undisturbed, tmp_path):
    got = run("eval_revert:2:mlp", tmp_path)
    assert_same_training(got, undisturbed("mlp"))  # the evaluation draws from its own generator
    for rank in got:
        assert not rank["sharded_at_end"]
        assert rank["state_bytes_end"] == rank["full_state_bytes"] + 4 * len(rank["shapes"])
