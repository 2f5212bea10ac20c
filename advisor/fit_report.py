"""``advisor fit``'s report (schema ``advisor.fit/1``), from the session a fitting process recorded.

Torch-free, like every report path. The memory figures are the memory probe's, read as ``advisor
attach`` reads them (``advisor.sections.memory``): the tracker's peak by category and the heaviest
modules, with the caching allocator's blocks on a GPU target; the model state is the parameters,
gradients and optimizer state live when the tracked step's optimizer step ended. The fixed costs
beside the tensors (``advisor.fit_costs``) are added to predict the device's use; the step time is
the roofline's (``advisor.fit_times``). When the prediction exceeds the target's memory (or
``--memory-budget``), the recommender is asked (``advise_state``, the one advice path) on the
session with the roofline's times, for a budget of the memory less the fixed costs, and its best
applicable recommendation that fits becomes the plan, written as ``advisor plan`` writes one.

Every rank of a data-parallel job runs the program rank 0 ran, on its own shards; the fitting
process is rank 0, and the figures are its. Where shards are uneven, rank 0 holds the first
chunks, the largest that PyTorch's chunking makes.
"""

from __future__ import annotations

from typing import Any

from advisor.advice import advise_state
from advisor.fit_costs import fixed_costs
from advisor.fit_times import roofline_step, with_roofline_times
from advisor.planning import plan_for, plannable
from advisor.records.advice import Recommendation
from advisor.records.events import warnings_of
from advisor.records.fit import FitSettings
from advisor.records.plan import save_plan
from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.sections.compute import device_spec_from_state
from advisor.sections.memory import build_memory_section
from advisor.state import SessionState

SCHEMA = "advisor.fit/1"
MODEL_STATE = ("parameter", "gradient", "optimizer_state")
TOP_MODULES = 8
TRACKED_STEP = 1  # the step a fit's memory probe tracks (advisor.records.fit.FIT_STEPS)


def _fit_event(state: SessionState) -> dict[str, Any]:
    found = [e for e in state.events if e.name == "fit"]
    return dict(found[-1].data) if found else {}


def model_state(state: SessionState) -> dict[str, int] | None:
    """Parameter, gradient and optimizer-state bytes of the lowest rank when the last tracked
    optimizer step ended (the tracker's ``optimizer_end`` sample), and their total."""
    ranks = {s.rank for s in state.memory}
    if not ranks:
        return None
    rank = 0 if 0 in ranks else min(ranks)
    ends = [s for s in state.memory if s.rank == rank and s.event == "optimizer_end"]
    if not ends:
        return None
    last = max(ends, key=lambda s: (s.step, s.time))
    figures = {c: int(last.categories.get(c, 0)) for c in MODEL_STATE}
    return {**figures, "total": sum(figures.values()), "step": last.step}


def _named(files: list[dict[str, Any]], shown: int = 3) -> str:
    return ", ".join(f["path"] for f in files[:shown]) + (f" and {len(files) - shown} more" if len(files) > shown else "")


def build_fit_report(state: SessionState, *, fit: FitSettings, budget_bytes: int | None) -> dict[str, Any]:
    event = _fit_event(state)
    spec = device_spec_from_state(state) or {}
    device = fit.device
    capacity = device.total_memory if device is not None else spec.get("memory_capacity")
    limit = budget_bytes or capacity
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "session": {"id": state.session_id, "path": state.session_path},
        "script": next((r.script for r in state.runs.values()), None),
        "argv": next((list(r.argv) for r in state.runs.values()), []),
        "target": {"key": fit.target, "name": device.name if device is not None else spec.get("name"),
                   "memory_bytes": capacity, "peak_flops": spec.get("peak_flops"),
                   "memory_bandwidth": spec.get("memory_bandwidth"), "ceilings_source": spec.get("source"),
                   "link_bandwidth": device.link_bandwidth if device is not None else None,
                   "network_bandwidth": device.network_bandwidth if device is not None else None},
        "world": {"nproc_per_node": fit.nproc_per_node, "nnodes": fit.nnodes, "world_size": fit.world_size,
                  "ranks_run": [0]},
        "run": {"steps": event.get("steps"), "steps_wanted": event.get("steps_wanted"),
                "stopped_at": event.get("stopped_at"), "stopped_by": event.get("stopped_by"),
                "placeholder_reads": event.get("placeholders") or [],
                "early_reads": event.get("early_reads") or [],
                "estimated_shapes": event.get("estimated_shapes") or [],
                "solver_reads": event.get("solver_reads") or [],
                "writes_folder": event.get("writes_folder"), "writes_redirected": event.get("writes") or [],
                "writes_created": event.get("created") or [],
                "random_draws": event.get("draws"),
                "exit_reason": state.exit_reason, "exit_code": state.exit_code},
        "unrunnable": _unrunnable(event),
        "warnings": warnings_of(state.events),
    }
    if report["unrunnable"] is not None or not state.memory:
        report.update(memory=None, time=None, verdict=None, plan=None, recommendations=[])
        return report
    memory = build_memory_section(state, budget_bytes=limit)
    costs = fixed_costs(fit, list(event.get("communicators") or []))
    tracked = int(memory.get("peak_bytes") or 0)
    predicted = tracked + sum(c.bytes for c in costs)
    report["memory"] = {
        "statistic": "peak over the tracked steps (rank 0)",
        "tracked_peak_bytes": tracked, "peak_step": memory.get("peak_step"),
        "block_rounding": "CUDA caching allocator, 512-byte blocks" if device is not None else None,
        "categories_at_peak": memory.get("categories_at_peak"),
        "categories_max": memory.get("categories_max"),
        "model_state": model_state(state),
        "modules": [{k: m.get(k) for k in ("name", "type", "parameter_bytes", "activation_bytes", "input_bytes")}
                    for m in (memory.get("modules") or [])[:TOP_MODULES]],
        "fixed_costs": [c.to_dict() for c in costs],
        "predicted_bytes": predicted,
        "not_predicted": "the caching allocator's reserve beyond its blocks (fragmentation, cache)"
                         if device is not None else None,
    }
    step = roofline_step(state, spec, fit)
    report["time"] = step.to_dict()
    incomplete = _incomplete(event)
    fits = predicted <= limit if limit and incomplete is None else None
    report["verdict"] = {"limit_bytes": limit, "limit": "--memory-budget" if budget_bytes else "the target's memory",
                         "predicted_bytes": predicted, "fits": fits,
                         "headroom_bytes": (limit - predicted) if limit else None, "incomplete": incomplete}
    tensor_budget = limit - sum(c.bytes for c in costs) if limit else None
    report["plan"] = None
    report["recommendations"] = []
    if fits is False:
        _, recs = advise_state(with_roofline_times(state, step), budget_bytes=max(1, tensor_budget or 1))
        report["recommendations"] = [r.to_dict() for r in recs]
        report["plan"] = _plan(recs, tensor_budget, costs_bytes=sum(c.bytes for c in costs))
    return report


def _incomplete(event: dict[str, Any]) -> str | None:
    """Why the tracked peak is not a whole training step's, or None. The memory probe tracks step
    1 (step 0 builds the optimizer's state): a run that stopped before step 1 ended has a peak
    without that step's activations or, before step 0 ended, its optimizer state. The zoo's llmc
    stopped at a formatted loss in step 1 and lbfgs_sine at its evaluation's ``.numpy()`` there,
    and both said "fits" on 26.6 MB against a measured 92.7 MB and 1.2 MB against 43.8 MB."""
    steps = event.get("steps")
    if steps is None or steps > TRACKED_STEP:
        return None
    return (f"the run stopped in step {steps}, before step {TRACKED_STEP} (the step the memory probe "
            f"tracks) ended: the peak holds what ran, not a whole training step")


def _unrunnable(event: dict[str, Any]) -> dict[str, Any] | None:
    found = event.get("unrunnable")
    early = event.get("early_reads") or []
    if not found and early and not event.get("steps"):
        # Values read before the first step got 0, and the script never reached a step: its flow
        # depended on them (a loop that skips a batch whose loss is not finite).
        where = {k: early[0][k] for k in ("file", "line", "code")}
        lines = "; ".join(f"{r['file']}:{r['line']} ({r['code']})" for r in early)
        found = {"kind": "read", "op": "aten._local_scalar_dense", "where": where,
                 "message": f"the script never reached its first optimizer step on fake tensors: it reads values "
                            f"the model computed before it, at {lines}, and fake tensors have none (each read "
                            "was answered with a placeholder)"}
    if not found:
        return None
    hints = {
        "read": "the value decides the script's path (a skipped batch, an early exit), and a fit has none: "
                "put the check behind a flag of the script's own, or after optimizer.step()",
        "shape": "a fit cannot know an output shape that depends on values; give the op a fixed size "
                 "(a padded index, a mask multiply) to plan the job",
        "kernel": "register a fake implementation for the op (torch.library.register_fake) so its output "
                  "shape is known",
    }
    return {**found, "hint": hints.get(found.get("kind"), "")}


def _plan(recs: list[Recommendation], budget: int | None, *, costs_bytes: int) -> dict[str, Any] | None:
    """The best recommendation a plan file can carry whose predicted peak fits ``budget``."""
    for rec in recs:
        peak = rec.predicted.peak_memory_bytes
        if peak is None or not plannable(rec) or not rec.fits:
            continue
        if budget is not None and peak > budget:
            continue
        return {"recommendation": rec.to_dict(), "predicted_tracked_bytes": peak, "predicted_bytes": peak + costs_bytes,
                "predicted_step_s": rec.predicted.step_time_s, "file": None}
    return {"recommendation": None, "why": "no remedy the recommender knows brings the predicted peak under "
                                             "the budget (more ranks, a smaller micro-batch?)"}


def write_fit_plan(report: dict[str, Any], path: str) -> str | None:
    """Write the plan the report chose, as ``advisor attach --plan`` reads it; its path, or None."""
    plan = report.get("plan") or {}
    if plan.get("recommendation") is None:
        return None
    rec = Recommendation.from_dict(plan["recommendation"])
    gpu = report.get("target", {}).get("key") != "cpu"
    save_plan(plan_for(rec, capped_cuda=gpu and rec.predicted.peak_memory_bytes is not None), path)
    return path


# -- text ---------------------------------------------------------------------------------
def render_fit_report(report: dict[str, Any]) -> str:
    """The report as text lines, every figure with its statistic."""
    target, world = report["target"], report["world"]
    lines = [f"advisor fit · {report.get('script')} · target {target['key']}"
             + (f" ({target['name']})" if target.get("name") and target["key"] != "cpu" else "")
             + (f" · {world['nproc_per_node']} per node x {world['nnodes']} node(s), world {world['world_size']}"
                if world["world_size"] > 1 else "")]
    run = report["run"]
    if run.get("stopped_by"):
        where, by = run.get("stopped_at") or {}, run["stopped_by"]
        what = {"shape": "its output shape depends on values",
                "data": "it reads tensor data, which fake tensors do not have"}.get(by["kind"], "it has no fake implementation")
        share = by.get("ran_share")
        ran = (f"; it came after {share:.0%} of a step's ops (as many as step {by['step'] - 1} ran), so about "
               f"{1 - share:.0%} of step {by['step']} is not counted") if isinstance(share, (int, float)) else \
            ", the rest of the step is not counted"
        lines.append(f"stopped early, in step {by['step']}, at {where.get('file')}:{where.get('line')}: {by['op']} "
                     f"cannot run on fake tensors ({what}); the figures below are those of the "
                     f"{run.get('steps')} step(s) before it{ran}")
    elif run.get("stopped_at"):
        where = run["stopped_at"]
        lines.append(f"ran {run.get('steps')} optimizer step(s) on fake tensors; stopped at {where.get('file')}:"
                     f"{where.get('line')} (the first value read after them)")
    elif run.get("steps") is not None:
        lines.append(f"ran {run.get('steps')} optimizer step(s) on fake tensors")
    for read in run.get("early_reads") or []:
        lines.append(f"  before the first optimizer step, {read['file']}:{read['line']} read a value {read['count']} "
                     f"time(s), answered with a placeholder (1.0 for a float, 0, False): if the script's flow depends on it, it may differ on the target: "
                     f"{read['code']}")
    for read in run.get("placeholder_reads") or []:
        lines.append(f"  {read['file']}:{read['line']} read a value {read['count']} time(s): answered with a placeholder "
                     f"(fake tensors have no values): {read['code']}")
    for shaped in run.get("estimated_shapes") or []:
        what = "a count read" if shaped["op"] == "read" else f"{shaped['op']}'s output"
        lines.append(f"  {shaped['file']}:{shaped['line']}: {what} sized from the nonzero count its mask implies "
                     f"({shaped['rows']} rows over {shaped['count']} call(s); exact for the total a top-k router "
                     f"sends, balanced routing for each expert's share): {shaped['code']}")
    for solver in run.get("solver_reads") or []:
        lines.append(f"  {solver['solver']} read a value {solver['count']} time(s) in its own tests: answered as if it "
                     "ran to its limits (max_iter iterations a step, every correction pair kept): its state is the "
                     "most it holds after these steps; a run that converges sooner holds less")
    written = run.get("writes_redirected") or []
    if written:
        lines.append(f"  the script wrote {len(written)} file(s) ({_named(written)}): written under "
                     f"{run.get('writes_folder')} instead (checkpoints, and files you had); none of yours changed")
    left = (run.get("random_draws") or {}).get("not_replayed") or {}
    if left:
        lines.append(f"  random draws not replayed on the host's generator ({', '.join(f'{op} x{n}' for op, n in left.items())}"
                     "): the script's later random choices (a shuffle) may differ from a real run's")
    created = run.get("writes_created") or []
    if created:
        lines.append(f"  the script created {len(created)} new file(s) where it said ({_named(created)}); "
                     "values it wrote from the model are placeholders")
    if report.get("unrunnable"):
        found = report["unrunnable"]
        where = found.get("where") or {}
        lines.append(f"cannot fit: the run cannot go on from {where.get('file', '?')}:{where.get('line', '?')} "
                     f"({found.get('op')}; see the error below)")
        return "\n".join(lines)
    memory = report.get("memory")
    if memory is None:
        lines.append("no memory was measured (did the script reach an optimizer step?)")
        return "\n".join(lines)
    ranks = "rank 0 (every rank runs the same program on its own shards)" if world["world_size"] > 1 else "the job"
    lines.append("")
    lines.append(f"memory per device, {ranks}:")
    lines.append(f"  tracked peak {fmt_bytes(memory['tracked_peak_bytes'])} in step {memory['peak_step']}"
                 + (f" ({memory['block_rounding']})" if memory.get("block_rounding") else ""))
    for category, nbytes in (memory.get("categories_at_peak") or {}).items():
        if nbytes:
            lines.append(f"    {category:<16} {fmt_bytes(nbytes):>10}")
    state = memory.get("model_state")
    if state:
        lines.append(f"  model state after the optimizer step of step {state['step']}: {fmt_bytes(state['total'])} "
                     f"(parameters {fmt_bytes(state['parameter'])}, gradients {fmt_bytes(state['gradient'])}, "
                     f"optimizer state {fmt_bytes(state['optimizer_state'])})")
    if memory.get("modules"):
        lines.append("  heaviest modules (saved for backward):")
        for row in memory["modules"]:
            if row.get("activation_bytes"):
                lines.append(f"    {row['name'] or '(model)':<28} {row['type']:<20} {fmt_bytes(row['activation_bytes']):>10}")
    for cost in memory.get("fixed_costs") or []:
        lines.append(f"  + {cost['name']}: {fmt_bytes(cost['bytes'])} ({cost['source']}: {cost['note']})")
    lines.append(f"  predicted device memory: {fmt_bytes(memory['predicted_bytes'])}"
                 + (f"; not predicted: {memory['not_predicted']}" if memory.get("not_predicted") else ""))
    time = report.get("time") or {}
    if time:
        phases = ", ".join(f"{k.removesuffix('_s')} {fmt_seconds(v)}" for k, v in time["by_phase"].items() if v)
        lines.append("")
        lines.append(f"step time, roofline estimate (a lower bound: every op at its roof) on {target['key']}: "
                     f"{fmt_seconds(time['step_s'])}")
        lines.append(f"  compute {fmt_seconds(time['compute_s'])} ({phases})")
        if time.get("collectives_s"):
            lines.append(f"  collectives {fmt_seconds(time['collectives_s'])} at the links' nominal bandwidth, "
                         f"{fmt_seconds(time['collectives_exposed_s'])} of it not hidden by compute")
    verdict = report.get("verdict") or {}
    lines.append("")
    if verdict.get("incomplete"):
        lines.append(f"fits: unknown ({verdict['incomplete']}; predicted so far "
                     f"{fmt_bytes(verdict['predicted_bytes'])})")
    elif verdict.get("fits") is None:
        lines.append("fits: unknown (no memory size for the target)")
    else:
        word = "fits" if verdict["fits"] else "does not fit"
        lines.append(f"{word}: predicted {fmt_bytes(verdict['predicted_bytes'])} of {fmt_bytes(verdict['limit_bytes'])} "
                     f"({verdict['limit']})")
    plan = report.get("plan")
    if plan:
        rec = plan.get("recommendation")
        if rec is None:
            lines.append(f"no plan: {plan.get('why')}")
        else:
            step_s = plan.get("predicted_step_s")
            lines.append(f"plan: {rec.get('title') or rec['remedy']} ({rec['id']}): predicted "
                         f"{fmt_bytes(plan['predicted_bytes'])} per device"
                         + (f", step {fmt_seconds(step_s)} (roofline estimate)" if step_s else ""))
            if plan.get("file"):
                lines.append(f"  written to {plan['file']}; apply it on the target with "
                             f"`advisor attach --plan {plan['file']} ...`")
    return "\n".join(lines)
