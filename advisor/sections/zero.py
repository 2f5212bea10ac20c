"""The report's ``zero`` section: the ZeRO stage in force on each rank at the end of the session.

Derived from the records alone (torch-free): the stage the script built (``ModelInfo.wrapper``:
DistributedDataParallel is 0, FSDP's ``fully_shard`` or legacy FullyShardedDataParallel 3, their
default full sharding; an optimizer named ZeroRedundancyOptimizer makes a DDP job 1), then the
``zero`` remedy's results on that rank in order (a joint plan's zero part's too): a kept apply sets its stage; a later
revert (an ``apply_reverted`` entry, which has no params) restores the stage before it. A rank's
entry carries the kept apply's predicted and measured figures beside each other.
"""

from __future__ import annotations

from typing import Any

from advisor.records.remedy import zero_stage
from advisor.records.results import ApplyResult
from advisor.state import SessionState

SHARDED_WRAPPERS = ("fully_shard", "FullyShardedDataParallel")


def script_stage(state: SessionState, rank: int) -> int | None:
    """The stage the script itself set up on ``rank`` (None: not data-parallel, or unknown)."""
    wrappers = [m.wrapper for m in state.models if m.rank == rank]
    if any(w in SHARDED_WRAPPERS for w in wrappers):
        return 3
    if "DistributedDataParallel" in wrappers:
        if any(o.name == "ZeroRedundancyOptimizer" for o in state.optimizers if o.rank == rank):
            return 1
        return 0
    return None


def build_zero_section(state: SessionState) -> list[dict[str, Any]]:
    """One entry per rank of a multi-rank job: ``rank``, ``stage``, ``since_step``, ``source``,
    ``recommendation_id``, ``predicted`` and ``measured`` (see docs/report-schema.md)."""
    if state.world_size <= 1:
        return []
    ranks = sorted(state.runs) or list(range(state.world_size))
    stacks: dict[int, list[dict[str, Any]]] = {}
    for rank in ranks:
        base = script_stage(state, rank)
        stacks[rank] = [{"rank": rank, "stage": base, "since_step": None,
                         "source": "script" if base is not None else None, "recommendation_id": None,
                         "predicted": None, "measured": None}]
    for entry in state.applied:
        if entry.remedy not in ("zero", "joint_plan"):
            continue
        if isinstance(entry, ApplyResult):  # an apply's result
            rank, stage = entry.rank, zero_stage(entry.remedy, entry.params)
            if entry.status == "kept" and rank in stacks and stage is not None:
                wire = entry.to_dict()
                stacks[rank].append({
                    "rank": rank, "stage": stage,
                    "since_step": entry.at_step, "source": "applied",
                    "recommendation_id": entry.recommendation_id,
                    "predicted": wire["predicted"], "measured": wire["measured"]["after"],
                })
            continue
        # A kept apply reverted later: the event names no rank, every rank sends one; it undoes
        # the lowest rank whose stage in force came from that recommendation.
        rid = entry.recommendation_id
        for rank in ranks:
            stack = stacks[rank]
            if len(stack) > 1 and stack[-1]["recommendation_id"] == rid:
                stack.pop()
                break
    return [stacks[rank][-1] for rank in ranks]
