"""A plan's remedies applied before the first step (``advisor attach --plan plan.json``).

The file format lives in ``advisor.records.plan``; ``load_plan`` here also checks each entry's
params against its applier. When: the agent calls ``apply_plan_before_first_step`` from a forward
pre-hook of the first root model it discovers, before that forward runs
(``install_plan_hook`` does this for one model). Nothing has been saved for
backward yet, so the first step already runs remedied: a job that OOMs at
step 0 without the plan fits from step 0 with it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from advisor.apply import registry
from advisor.apply.executor import DEFAULT_MEASURE_STEPS, Executor
from advisor.apply.agreement import Agreement, Verdict
from advisor.apply.orchestrator import Outcome, apply_in_order
from advisor.apply.target import Target
from advisor.records.results import ApplyResult, ApplyStarted
from advisor.records.context import AgentContext
from advisor.records.plan import Plan, PlanEntry, PlanError, read_plan
from advisor.records.remedy import command_digest

__all__ = ["Plan", "PlanEntry", "PlanError", "load_plan", "apply_plan_before_first_step", "install_plan_hook"]

logger = logging.getLogger("advisor.apply")

def check_entry(remedy: str, params: Any) -> None:
    """``ValueError`` when ``params`` do not fit ``remedy``'s applier."""
    registry.check_params(remedy, params)


def load_plan(path: str | Path) -> Plan:
    """Read a plan file and check every entry against the appliers; ``PlanError`` says what is wrong."""
    return read_plan(path, check=check_entry)


def apply_plan_before_first_step(
    ctx: AgentContext,
    plan: Plan,
    *,
    model: nn.Module | None = None,
    executor: Executor | None = None,
    measure_steps: int = DEFAULT_MEASURE_STEPS,
) -> list[ApplyResult]:
    """Apply every entry of ``plan`` to ``model`` (default: the first discovered model), in order.

    Entries are independent and applied in the orchestrator's phase order
    (``advisor.apply.orchestrator``): one that fails is reported "failed" (the apply
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
    target = executor.target() if executor is not None else Target.of(model, ctx.optimizers())
    if model not in target.wrapped_models and model not in target.models:
        target.wrapped_models.insert(0, model)  # the model being started is the plan's model
    at_step = ctx.step
    applied: list[ApplyResult] = []
    handles: list[registry.RemedyHandle] = []
    results: list[ApplyResult] = []
    outcomes = apply_in_order(target, [(e.remedy, e.params) for e in plan.remedies])
    verdicts = _agree(ctx, executor, target, plan, outcomes)
    for entry, outcome, verdict in zip(plan.remedies, outcomes, verdicts):
        base = ApplyResult(remedy=entry.remedy, recommendation_id=entry.recommendation_id,
                           params=dict(entry.params), rank=ctx.rank, at_step=at_step, status="kept",
                           reason="applied from the plan before the first step")
        if outcome.handle is None:
            exc = outcome.error
            failed = base.with_(status="failed", at_step=None, error=f"{type(exc).__name__}: {exc}",
                                reason="applying raised; nothing was changed")
            logger.warning("Plan entry %s failed: %s", entry.remedy, exc)
            ctx.emit(failed.event(rank=ctx.rank, step=at_step))
            results.append(failed)
            continue
        if verdict.revert:  # applied here, failed on another rank: every rank runs the same job
            outcome.handle.revert()
            reverted = base.with_(status="reverted", reason=verdict.reason or "reverted on every rank")
            ctx.emit(reverted.event(rank=ctx.rank, step=at_step))
            results.append(reverted)
            continue
        handles.append(outcome.handle)
        ctx.emit(ApplyStarted(remedy=entry.remedy, recommendation_id=entry.recommendation_id, params=base.params,
                              at_step=at_step, from_plan=True).event(rank=ctx.rank, step=at_step))
        applied.append(base)
        results.append(base)
    if applied:
        if executor is not None:
            executor.adopt(applied, handles, at_step=at_step, measure_steps=measure_steps)
        else:
            for result in applied:
                ctx.emit(result.event(rank=ctx.rank, step=at_step))
    return results


def _agree(ctx: AgentContext, executor: Executor | None, target: Target, plan: Plan,
           outcomes: list[Outcome]) -> list[Verdict]:
    """One vote over the job's ranks for every entry: an entry that failed anywhere is reverted
    everywhere (every rank reaches this at its first forward, in the same order)."""
    agreement = executor.agreement if executor is not None else Agreement()
    agreement.bind(target.process_group)
    digest = command_digest("plan", plan.to_dict(), None)
    return agreement.vote_each([o.handle is None for o in outcomes], digest=digest)


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
