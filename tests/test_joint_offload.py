"""A ZeRO stage and optimizer-state offload (and activation offload) applied live as one joint plan
on 2 gloo ranks (issue 33): the stage goes first and the offload moves only this rank's shard (a
DTensor's local shard under ZeRO-2/3, kept a DTensor of the same layout), every loss and parameter
stays equal bit for bit to the undisturbed run, kept or reverted. On a CPU-only job the offload's copies are
same-device copies (the applier's own CPU path); the recommender never offers it there."""

from __future__ import annotations

import pytest
from test_zero import run

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> list[dict]:
    return run("none:1:mlp", tmp_path_factory.mktemp("joint_offload"))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_stage_then_the_offload_of_its_shard_keep_every_loss(undisturbed, tmp_path, stage) -> None:
    ranks = run(f"offload_joint:{stage}:mlp", tmp_path)
    for r in range(2):
        assert ranks[r]["order"] == ["zero", "optimizer_offload"]  # placement after layout, whatever the list said
        assert ranks[r]["losses"] == undisturbed[r]["losses"]
        assert ranks[r]["params"] == undisturbed[r]["params"]
        # Between steps every state tensor is the offload's host buffer, as the type the stage made.
        assert ranks[r]["held_by_offload"]
        assert ranks[r]["state_types"] == (["Tensor"] if stage == 1 else ["DTensor"])
        # Only this rank's share moved: about half of AdamW's two moments of the whole model.
        assert 0 < ranks[r]["host_bytes"] < 0.75 * ranks[r]["full_state_bytes"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_reverting_the_plan_brings_back_the_whole_replicated_state(undisturbed, tmp_path, stage) -> None:
    ranks = run(f"offload_joint_revert:{stage}:mlp", tmp_path)
    for r in range(2):
        assert ranks[r]["losses"] == undisturbed[r]["losses"]
        assert ranks[r]["params"] == undisturbed[r]["params"]
        n = len(ranks[r]["shapes"])
        assert ranks[r]["state_bytes_after_revert"] == ranks[r]["full_state_bytes"] + 4 * n
        assert not ranks[r]["sharded_at_end"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_part_kind_in_one_plan_keeps_every_loss_kept_or_reverted(undisturbed, tmp_path, stage) -> None:
    """One block offloaded and the next checkpointed (their saved tensors hooked before FSDP2 wraps
    the blocks), the stage, and the state on the host: applied in phase order whatever the list's,
    exact, and reverted whole."""
    for scenario in ("blocks_joint", "blocks_joint_revert"):
        ranks = run(f"{scenario}:{stage}:mlp", tmp_path)
        for r in range(2):
            assert ranks[r]["order"] == ["activation_offload", "zero", "optimizer_offload"]
            assert ranks[r]["losses"] == undisturbed[r]["losses"]
            assert ranks[r]["params"] == undisturbed[r]["params"]
            assert ranks[r]["activation_offloaded_bytes"] > 0  # the block's saved tensors went through the host
        if scenario == "blocks_joint_revert":
            assert all(rk["state_bytes_after_revert"] == rk["full_state_bytes"] + 4 * len(rk["shapes"]) for rk in ranks)
            assert all(rk["checkpointed_after_revert"] == 0 and not rk["sharded_at_end"] for rk in ranks)
