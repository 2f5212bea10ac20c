"""``advisor plan [SESSION] -o plan.json``: from a recorded (perhaps OOM-ed) run to a plan that fits.

The recommendation comes from the session's advice (``advisor.advice.advise_state``, the path the
live loop and ``advisor report`` share), not from a report built around it.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from advisor.advice import advise_state, recorded_budget, session_budget
from advisor.errors import AdvisorError, SessionError
from advisor.paths import DB_NAME, sessions_dir
from advisor.recommend.remedies import specs
from advisor.records.advice import Diagnosis, Recommendation
from advisor.records.events import DeviceSpec, Oom
from advisor.records.plan import Plan, PlanEntry, save_plan
from advisor.records.results import ApplyResult
from advisor.records.samples import rank_of_interest
from advisor.records.units import fmt_bytes
from advisor.state import SessionState
from advisor.store import load_state


def memory_trouble(state: SessionState) -> str | None:
    """Why this session needs a plan: it ran out of memory, or its peak went over the budget it
    was recorded with while no remedy was kept; None when neither."""
    if any(e.name == Oom.NAME for e in state.events):
        return "it ran out of memory"
    budget = recorded_budget(state)
    peak = max((s.total_bytes for s in state.memory), default=None)
    kept = [a for a in state.applied if isinstance(a, ApplyResult) and a.status == "kept"]
    reverted_later = bool(kept) and state.applied[-1].status != "kept"
    if budget and peak is not None and peak > budget and (not kept or reverted_later):
        return f"its peak {fmt_bytes(peak)} went over its {fmt_bytes(budget)} budget"
    return None


def latest_session_to_plan() -> Path:
    """The newest session that ran out of memory or over its budget; says which on stderr."""
    for db in sorted(sessions_dir(create=False).glob(f"*/{DB_NAME}"), reverse=True):
        try:
            why = memory_trouble(load_state(db))
        except SessionError:
            continue
        if why:
            print(f"advisor: planning from session {db.parent.name}: {why}", file=sys.stderr)
            return db
    raise SessionError("no recorded session ran out of memory or over its budget",
                       hint="pass a SESSION (`advisor sessions` lists them) with --memory-budget SIZE, "
                            "or record one: `advisor attach --headless --memory-budget SIZE --enforce-budget SCRIPT`")


def _nothing_to_plan(state: SessionState, diagnosis: Diagnosis | None, budget: int | None) -> AdvisorError:
    """Why there is no plan, and what would give one."""
    rank = rank_of_interest({s.rank for s in state.memory})
    peak = max((s.total_bytes for s in state.memory if s.rank == rank), default=None)
    kept = [a for a in state.applied if isinstance(a, ApplyResult) and a.status == "kept"]
    if peak is None:
        return AdvisorError("nothing to plan: the session has no memory measurements",
                            hint="record it with the memory probe on (`--probes all`, the default)")
    if kept and state.applied[-1].status == "kept":
        return AdvisorError(f"nothing to plan: the remedy kept in this session ({kept[-1].remedy}) "
                            "already makes it fit",
                            hint="`advisor plan -o FILE` with no SESSION plans from the latest session "
                                 "that ran out of memory")
    summary = diagnosis.summary if diagnosis is not None else None
    if any(e.name == Oom.NAME for e in state.events):
        # The recorded peak stops short of the failed request: the job did not fit.
        return AdvisorError(f"nothing to plan: {summary or 'the job ran out of memory'}, and no "
                            f"remedy fits the {fmt_bytes(budget) if budget else 'device'} budget",
                            hint="the report's diagnosis says what would (more ranks or devices, a smaller "
                                 "micro-batch); or pass a larger --memory-budget")
    if budget and peak <= budget:
        return AdvisorError(f"nothing to plan: the job fits (peak {fmt_bytes(peak)} of a "
                            f"{fmt_bytes(budget)} budget)",
                            hint=f"pass --memory-budget below {fmt_bytes(peak)} to plan for less memory")
    return AdvisorError(f"nothing to plan: {summary or 'no applicable remedy for this session'}",
                        hint="`advisor report SESSION` shows the diagnosis and why no remedy applies")


def with_host_link(state: SessionState, bandwidth: float) -> SessionState:
    """``state`` with every ``device_spec`` event's host-link figure replaced by ``bandwidth``
    (bytes/s, source ``override``), as the agent's own override would have recorded it; a
    session without a device spec gets one carrying only that figure."""
    fields = {"host_link_bandwidth": float(bandwidth), "host_link_source": "override"}
    if not any(e.name == DeviceSpec.NAME for e in state.events):
        state.events.append(DeviceSpec(**fields).event(rank=0))
    state.events[:] = [replace(e, data={**e.data, **fields}) if e.name == DeviceSpec.NAME else e
                       for e in state.events]
    return state


def write_plan_from_session(db_path: Path, output: str, *, budget_bytes: int | None,
                            recommendation_id: str | None, host_link_bandwidth: float | None = None) -> int:
    state = load_state(db_path)
    if host_link_bandwidth is not None:
        state = with_host_link(state, host_link_bandwidth)
    budget = session_budget(state, budget_bytes)
    diagnosis, advice = advise_state(state, budget_bytes=budget)
    # Applicable remedies only: live ones, restart ones the plan can carry (an environment), and
    # restart ones that change the training loop (printed: a plan file cannot carry code).
    recs = [r for r in advice if r.live or _plan_env(r.remedy) or _loop_change(r)]
    if recommendation_id:
        chosen = next((r for r in recs if r.id == recommendation_id), None)
        if chosen is None:
            raise AdvisorError(f"no recommendation {recommendation_id!r} in this session",
                               hint=f"valid: {', '.join(r.id for r in recs) or 'none'}")
    else:
        chosen = recs[0] if recs else None
    if chosen is None:
        raise _nothing_to_plan(state, diagnosis, budget)
    change = _loop_change(chosen)
    if change and not chosen.live:
        print(change)
        print(f"no plan written to {output}: {chosen.title or chosen.remedy} needs the training loop "
              "changed as printed above (every rank), then a restart", file=sys.stderr)
        return 0
    save_plan(plan_for(chosen, capped_cuda=_capped_cuda(state, chosen)), output)
    print(f"wrote plan {output}: {chosen.title or chosen.remedy}; run it with "
          f"`advisor attach --plan {output} ...`", file=sys.stderr)
    return 0


def _loop_change(rec: Recommendation) -> str | None:
    """The code a restart recommendation asks of the training loop (a multi-rank pipeline's
    per-rank ``schedule.step`` calls), or None."""
    change = rec.params.get("loop_change")
    return change if isinstance(change, str) and change.strip() else None


def plan_for(recommendation: Recommendation, *, capped_cuda: bool = False) -> Plan:
    """The plan that applies one recommendation at the next attach.

    ``capped_cuda``: a memory remedy planned for a CUDA job that ran out of memory or over its
    budget also gets expandable allocator segments in its environment (a restart setting, exact).
    On an H200 the planned checkpointing run fitted its tensors (2.67 GiB of a 3.58 GiB cap) and
    still ran out: the caching allocator held 730 MiB of reserve no tensor used."""
    env = _plan_env(recommendation.remedy)
    if capped_cuda:
        env = {**_plan_env("expandable_segments"), **env}
    return Plan(remedies=(PlanEntry(remedy=recommendation.remedy, params=dict(recommendation.params),
                                    recommendation_id=recommendation.id),),
                env=env)


def _capped_cuda(state: SessionState, recommendation: Recommendation) -> bool:
    """A memory remedy for a CUDA job (the user's own allocator options are kept beside the
    plan's: ``advisor.controller.merge_plan_env``)."""
    run = state.runs.get(0) or (state.runs[min(state.runs)] if state.runs else None)
    spec = specs().get(recommendation.remedy)
    return (run is not None and run.device.get("type") == "cuda" and spec is not None
            and "memory" in spec.addresses)


def plannable(recommendation: Recommendation) -> bool:
    """Whether a plan can carry it: a live remedy, or a restart one with the environment it needs."""
    return bool(recommendation.live or _plan_env(recommendation.remedy))


def _plan_env(remedy: str) -> dict[str, str]:
    """The environment a restart remedy needs (its spec's ``plan_env``), else {}."""
    spec = specs().get(remedy)
    return dict(spec.plan_env) if spec is not None else {}
