"""A plan file: remedies to apply before the first step (``advisor attach --plan plan.json``).

Format::

    {"version": "advisor.plan/1",
     "remedies": [{"remedy": "activation_checkpointing",
                   "params": {"modules": ["blocks.0"]},
                   "recommendation_id": "r1"}],
     "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}

``env`` (optional): variables ``advisor attach --plan`` sets in the training process's
environment before it starts (a restart remedy such as expandable allocator segments, which
the allocator reads once at start-up). Torch-free: ``advisor plan`` writes it in the controller, the agent reads it.

Plans are meant to be shared, so a plan must not be able to run code: ``env`` takes only the
allocator's and the libraries' tuning settings (``ENV_ALLOWED``, ``ENV_ALLOWED_PREFIXES``), and
among those never one that names a file or a library to load (``NCCL_NET_PLUGIN``,
``NCCL_DEBUG_FILE``...). ``PYTHONPATH`` with a ``sitecustomize.py`` there ran its code in the
training process; ``LD_PRELOAD`` or the advisor's own ``ADVISOR_*`` would do as much. Anything
else is refused with the reason, before the job starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

Check = Callable[[str, Any], None]

PLAN_VERSION = "advisor.plan/1"

ENV_ALLOWED = frozenset({"PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_DEVICE_MAX_CONNECTIONS"})
ENV_ALLOWED_PREFIXES = ("NCCL_", "TORCH_NCCL_")
# Within the prefixes: variables that name a file to read or write, or a library to load.
_ENV_FILE_WORDS = ("PLUGIN", "FILE", "PATH", "DIR", "LIB", "CONF")
MAX_ENV_VALUE = 4096


def env_refusal(name: str, value: str) -> str | None:
    """Why a plan may not set ``name`` to ``value`` (one sentence), or None when it may."""
    if name in ENV_ALLOWED or (name.startswith(ENV_ALLOWED_PREFIXES) and name not in ENV_ALLOWED_PREFIXES):
        if name not in ENV_ALLOWED and any(word in name for word in _ENV_FILE_WORDS):
            return f"{name} names a file or a library the training process would read or load"
        if "\0" in value or len(value) > MAX_ENV_VALUE:
            return f"the value of {name} is not a setting (a NUL byte, or over {MAX_ENV_VALUE} characters)"
        return None
    if name.startswith("ADVISOR_"):
        return f"{name} is the advisor's own: a plan must not redirect it"
    if name in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONEXECUTABLE") \
            or name.startswith(("LD_", "DYLD_")) or name in ("PATH", "BASH_ENV", "ENV"):
        return f"{name} can make the training process load and run code that is not the script"
    return f"{name} is not an allocator or library setting a plan may set"


def _allowed_list() -> str:
    return ", ".join(sorted(ENV_ALLOWED) + [p + "*" for p in ENV_ALLOWED_PREFIXES])


class PlanError(ValueError):
    """A plan file that cannot be used; the message says where and what is valid."""


@dataclass(frozen=True, kw_only=True)
class PlanEntry:
    remedy: str
    params: dict[str, Any] = field(default_factory=dict)
    recommendation_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"remedy": self.remedy, "params": dict(self.params)}
        if self.recommendation_id is not None:
            out["recommendation_id"] = self.recommendation_id
        return out


@dataclass(frozen=True, kw_only=True)
class Plan:
    remedies: tuple[PlanEntry, ...] = ()
    version: str = PLAN_VERSION
    env: dict[str, str] = field(default_factory=dict)  # set in the training process's environment

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "remedies": [e.to_dict() for e in self.remedies]}
        if self.env:
            out["env"] = dict(self.env)
        return out


def parse_plan(data: Any, *, source: str = "plan", check: Check | None = None) -> Plan:
    """Validate a decoded plan; ``PlanError`` names the bad entry and the valid choices.

    ``check(remedy, params)`` raises ``ValueError`` for params its applier would refuse (the
    training process passes the appliers' check; the controller needs no torch to read a plan)."""
    if not isinstance(data, Mapping):
        raise PlanError(f"{source}: expected a JSON object with 'version' and 'remedies'")
    if data.get("version") != PLAN_VERSION:
        raise PlanError(f"{source}: version {data.get('version')!r}; valid: [{PLAN_VERSION!r}]")
    env = data.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and k and "=" not in k and isinstance(v, str)
                                               for k, v in env.items()):
        raise PlanError(f"{source}: 'env' must be an object of variable names to string values")
    for name, value in env.items():
        why = env_refusal(name, value)
        if why is not None:
            raise PlanError(f"{source}: env {name[:60]!r} refused: {why}; a plan's env may set only "
                            f"{_allowed_list()}")
    items = data.get("remedies")
    if not isinstance(items, list):
        raise PlanError(f"{source}: 'remedies' must be a list")
    entries = []
    for i, item in enumerate(items):
        where = f"{source}: remedies[{i}]"
        if not isinstance(item, Mapping):
            raise PlanError(f"{where}: expected an object with 'remedy' and 'params'")
        unknown = sorted(set(item) - {"remedy", "params", "recommendation_id"})
        if unknown:
            raise PlanError(f"{where}: unknown keys {unknown}; valid: ['params', 'recommendation_id', 'remedy']")
        params = item.get("params", {})
        if not isinstance(params, Mapping):
            raise PlanError(f"{where}: 'params' must be an object")
        rec_id = item.get("recommendation_id")
        if rec_id is not None and not isinstance(rec_id, str):
            raise PlanError(f"{where}: 'recommendation_id' must be a string")
        if not isinstance(item.get("remedy"), str):
            raise PlanError(f"{where}: 'remedy' must be a string")
        if check is not None:
            try:
                check(item["remedy"], params)
            except ValueError as exc:
                raise PlanError(f"{where}: {exc}") from None
        entries.append(PlanEntry(remedy=item["remedy"], params=dict(params), recommendation_id=rec_id))
    return Plan(remedies=tuple(entries), env=dict(env))


def read_plan(path: str | Path, *, check: Check | None = None) -> Plan:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"{path}: not JSON: {exc}") from None
    return parse_plan(data, source=str(path), check=check)


def save_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(json.dumps(plan.to_dict(), indent=2) + "\n", encoding="utf-8")
