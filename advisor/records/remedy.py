"""What both halves of a remedy agree on without torch: plan phases and the command digest.

``PHASES`` is the fixed order in which one plan applies several remedies (the predictor's
``RemedySpec.phase`` and the applier module's ``PHASE`` each name one). ``command_digest``
identifies one decided apply, so every rank can check it enacts the same one.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

# Order of application within one plan, and why:
PHASES: tuple[str, ...] = (
    "saved-tensors",  # what a module keeps for backward (checkpointing, activation offload): needs the
                      # original module tree, so it goes before anything that wraps or splits modules
    "optimizer",  # the optimizer's implementation (fused kernels): on the user's optimizer object,
                  # before sharding re-partitions its state
    "layout",  # how parameters and modules are laid out across ranks (ZeRO/FSDP, pipeline split)
    "placement",  # where state lives between uses (optimizer-state offload): after sharding, so each rank
                  # moves only its own shard, and its revert (first) hands the sharding back device tensors
)


def parse_phase(value: str) -> str:
    """``value`` if it names a phase, else ``ValueError`` naming the valid ones."""
    if value not in PHASES:
        raise ValueError(f"unknown remedy phase {value!r}; valid: {', '.join(PHASES)}")
    return value


def phase_rank(value: str | None) -> int:
    """Sort key of a phase; unknown or missing phases go last."""
    return PHASES.index(value) if value in PHASES else len(PHASES)


def command_digest(remedy: str, params: Mapping[str, Any], at_step: int | None) -> str:
    """sha256 of the canonical JSON of (remedy, params, at_step): equal on every rank iff the same apply."""
    canonical = json.dumps({"remedy": remedy, "params": params, "at_step": at_step},
                           sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def parts_of(remedy: str, params: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The remedies an apply enacts: a joint plan's parts (``params["parts"]``), else itself."""
    if remedy == "joint_plan":
        return [(str(p.get("remedy")), p.get("params") or {}) for p in params.get("parts") or []
                if isinstance(p, Mapping)]
    return [(remedy, params)]


def zero_stage(remedy: str, params: Mapping[str, Any]) -> int | None:
    """The ZeRO stage an apply puts in force (the ``zero`` remedy's, or a joint plan's zero part's);
    None when it sets none."""
    return next((p.get("stage") for name, p in parts_of(remedy, params) if name == "zero"), None)


def applied_name(remedy: str | None, recommendation_id: str | None) -> str:
    """How a user names what was applied: a joint plan by its id (``zero-3+ckpt-2``, which names
    its parts; "joint_plan" says nothing), a single remedy by its name."""
    if remedy == "joint_plan" and recommendation_id:
        return recommendation_id
    return str(remedy or recommendation_id or "")
