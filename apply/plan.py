"""A plan file: remedies applied before the first step (``advisor attach --plan plan.json``).

Format::

    {"version": "advisor.plan/1",
     "remedies": [{"remedy": "activation_checkpointing",
                   "params": {"modules": ["blocks.0"]},
                   "recommendation_id": "r1"}]}

When: the agent calls ``apply_plan_before_first_step`` from a forward
pre-hook of the first root model it discovers, before that forward runs
(``install_plan_hook`` does this for one model). Nothing has been saved for
backward yet, so the first step already runs remedied: a job that OOMs at
step 0 without the plan fits from step 0 with it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from torch import nn
from torch.utils.hooks import RemovableHandle

from apply import registry
from apply.executor import DEFAULT_MEASURE_STEPS, Executor
from apply.results import ApplyResult
from probes.probe import AgentContext
from probes.records import Event

logger = logging.getLogger("advisor.apply")

PLAN_VERSION = "advisor.plan/1"


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

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "remedies": [e.to_dict() for e in self.remedies]}


def parse_plan(data: Any, *, source: str = "plan") -> Plan:
    """Validate a decoded plan; ``PlanError`` names the bad entry and the valid choices."""
    if not isinstance(data, Mapping):
        raise PlanError(f"{source}: expected a JSON object with 'version' and 'remedies'")
    if data.get("version") != PLAN_VERSION:
        raise PlanError(f"{source}: version {data.get('version')!r}; valid: [{PLAN_VERSION!r}]")
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
        try:
            clean, _ = registry.split_params(params)
            registry.check_params(str(item.get("remedy")), clean)
        except ValueError as exc:
            raise PlanError(f"{where}: {exc}") from None
        entries.append(PlanEntry(remedy=item["remedy"], params=dict(params), recommendation_id=rec_id))
    return Plan(remedies=tuple(entries))


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"{path}: not JSON: {exc}") from None
    return parse_plan(data, source=str(path))


def save_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(json.dumps(plan.to_dict(), indent=2) + "\n", encoding="utf-8")


def apply_plan_before_first_step(
    ctx: AgentContext,
    plan: Plan,
    *,
    model: nn.Module | None = None,
    executor: Executor | None = None,
    measure_steps: int = DEFAULT_MEASURE_STEPS,
) -> list[ApplyResult]:
    """Apply every entry of ``plan`` to ``model`` (default: the first discovered model), in order.

    Entries are independent: one that fails is reported "failed" (the apply
    functions are atomic) and the rest still apply, since each one that fits
    helps a job that would not fit at all. With an ``executor`` the applied
    entries are measured over the first steps and reported then (always kept:
    reverting would put back the job that did not fit); without one their
    results are emitted at once, with nothing measured.
    """
    if model is None:
        models = ctx.models()
        if not models:
            raise RuntimeError("no model discovered yet; apply the plan from the model's forward pre-hook")
        model = models[0]
    at_step = ctx.step
    applied: list[ApplyResult] = []
    handles: list[registry.RemedyHandle] = []
    results: list[ApplyResult] = []
    for entry in plan.remedies:
        base = ApplyResult(remedy=entry.remedy, recommendation_id=entry.recommendation_id,
                           params={k: v for k, v in entry.params.items() if k != registry.FAULT_KEY},
                           rank=ctx.rank, at_step=at_step, status="kept",
                           reason="applied from the plan before the first step")
        try:
            handles.append(registry.apply_remedy(model, entry.remedy, entry.params))
        except Exception as exc:
            failed = base.with_(status="failed", at_step=None, error=f"{type(exc).__name__}: {exc}",
                                reason="applying raised; nothing was changed")
            logger.warning("Plan entry %s failed: %s", entry.remedy, exc)
            ctx.emit(Event(rank=ctx.rank, step=at_step, name="apply_result", data=failed.to_dict()))
            results.append(failed)
            continue
        ctx.emit(Event(rank=ctx.rank, step=at_step, name="apply_started",
                       data={"remedy": entry.remedy, "recommendation_id": entry.recommendation_id,
                             "params": base.params, "at_step": at_step, "from_plan": True}))
        applied.append(base)
        results.append(base)
    if applied:
        if executor is not None:
            executor.adopt(applied, handles, at_step=at_step, measure_steps=measure_steps)
        else:
            for result in applied:
                ctx.emit(Event(rank=ctx.rank, step=at_step, name="apply_result", data=result.to_dict()))
    return results


def install_plan_hook(
    model: nn.Module,
    ctx: AgentContext,
    plan: Plan,
    *,
    executor: Executor | None = None,
) -> RemovableHandle:
    """Apply ``plan`` to ``model`` once, in its first forward pre-hook (before that forward runs)."""

    def hook(module: nn.Module, args: Any) -> None:
        handle.remove()  # once only; _call_impl iterates over a copy of the hooks, so this is safe
        apply_plan_before_first_step(ctx, plan, model=module, executor=executor)

    handle = model.register_forward_pre_hook(hook)
    return handle
