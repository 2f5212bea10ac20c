"""The script's own checkpoint saves and ZeRO (issue 11): one rule for the agent and the controller.

The agent reports each kind of save of captured state (``checkpoint_save`` events,
``advisor/agent/saves.py``): ``api`` one of ``CHECKPOINT_APIS``, ``saves`` a subset of
``CHECKPOINT_SAVES``. Under ZeRO each rank's ``optimizer.state_dict()`` holds only its own part
of the state, and under stages 2 and 3 ``model.state_dict()`` holds DTensor shards, so:

- ``torch.save`` of the optimizer's state is partial under every stage;
- ``torch.save`` of the model's state is partial under stages 2 and 3;
- torch.distributed.checkpoint of the optimizer's state is partial under stage 1 (each rank's
  partitioned state dict numbers only the parameters it owns, from 0 on every rank, so the
  ranks' entries collide); DCP writes every rank's DTensor shard under stages 2 and 3.

The agent warns when such a save happens under ZeRO in force; the ZeRO predictor
(``recommend/remedies/zero.py``) refuses the stages that would make a seen save partial.
"""

from __future__ import annotations

from typing import Iterable

CHECKPOINT_APIS = ("torch.save", "dcp.save", "dcp.async_save")
CHECKPOINT_SAVES = ("model", "optimizer")


def partial_state(api: str, saves: Iterable[str], stage: int) -> str | None:
    """Which state ("optimizer" or "model") a save of ``saves`` through ``api`` would hold only
    in part under ZeRO-``stage``, or None when that save stays whole (stage 0: no ZeRO)."""
    what = set(saves)
    plain = api == "torch.save"
    if stage <= 0:
        return None
    if "optimizer" in what and (plain or stage == 1):
        return "optimizer"
    if plain and "model" in what and stage in (2, 3):
        return "model"
    return None
