"""The report's memory section: categories over time and at peak, heaviest modules, the OOM record.

``build_memory_section`` returns plain data (the JSON report's ``memory`` object, a public
contract); ``render_memory_section`` turns it into rich renderables (advisor/trace.py exports
the timeline as Chrome/Perfetto counter events).
"""

from __future__ import annotations

import statistics
from typing import Any

from advisor.blocks import Block, Cell, Column, Facts, Lines, Table
from advisor.records.events import ModuleActivations, payloads
from advisor.records.results import ApplyResult
from advisor.records.samples import MEMORY_CATEGORIES, MemorySample, ModuleStat, max_by_category, rank_of_interest
from advisor.records.units import MISSING, fmt_bytes, fmt_seconds
from advisor.rich_text import to_rich
from advisor.sections.timebase import light_module_times, light_phase_time, light_step_time, scale
from advisor.state import SessionState

MAX_TIMELINE_POINTS = 2000


def _ordered(samples: list[MemorySample], state: SessionState) -> list[tuple[float, MemorySample]]:
    """(seconds since the first sampled step began, sample), in order.

    A sample's ``time`` counts from the start of its step; steps are laid end to end using the
    step's own duration (``StepSample.time_s``) where known, else the last sample time seen.
    """
    durations = {s.index: s.time_s for rank_steps in state.steps.values() for s in rank_steps}
    by_step: dict[int, list[MemorySample]] = {}
    for sample in samples:
        by_step.setdefault(sample.step, []).append(sample)
    out: list[tuple[float, MemorySample]] = []
    offset = 0.0
    for step in sorted(by_step):
        group = sorted(by_step[step], key=lambda s: s.time)
        out.extend((offset + s.time, s) for s in group)
        offset += max(durations.get(step, 0.0), group[-1].time)
    return out


def _downsample(points: list[tuple[float, MemorySample]], limit: int) -> list[tuple[float, MemorySample]]:
    """At most ``limit`` points, keeping the highest total of each bucket (so the peak survives)."""
    if len(points) <= limit:
        return points
    size = -(-len(points) // limit)
    return [max(points[i : i + size], key=lambda p: p[1].total_bytes) for i in range(0, len(points), size)]


def build_memory_section(state: SessionState, *, budget_bytes: int | None) -> dict[str, Any]:
    """The ``memory`` object of the JSON report, from one rank (0 unless only others reported)."""
    rank = rank_of_interest({s.rank for s in state.memory} | {m.rank for m in state.modules})
    samples = [s for s in state.memory if s.rank == rank]
    points = _ordered(samples, state)
    peak = max(samples, key=lambda s: s.total_bytes, default=None)
    categories_max = max_by_category(samples)
    categories_at_peak = (
        {c: int(peak.categories.get(c, 0)) for c in MEMORY_CATEGORIES} if peak is not None else {}
    )
    timeline = [
        {
            "time": round(t, 6),
            "step": s.step,
            "event": s.event,
            "module": s.module,
            "total_bytes": s.total_bytes,
            "categories": {c: int(s.categories.get(c, 0)) for c in MEMORY_CATEGORIES},
            "steps_covered": s.steps_covered,
        }
        for t, s in _downsample(points, MAX_TIMELINE_POINTS)
    ]
    modules = _modules(state, rank)
    checkpointed = _checkpointed(state)
    for row in modules:
        row["checkpointed"] = row["name"] in checkpointed
    time_scale = _module_time_scale(state, modules)
    measured = light_module_times(state)
    spans = light_module_times(state, "module_recompute_s")
    for row in modules:
        timed = measured.get(row["name"])
        row["light_forward_s"] = timed if timed is not None else row["forward_s"] * time_scale["forward"]
        row["light_forward_measured"] = timed is not None
        row["light_recompute_s"] = spans.get(row["name"])
        row["light_backward_s"] = row["backward_s"] * time_scale["backward"]
    peak_bytes, peak_step, source = (peak.total_bytes, peak.step, "tracked") if peak is not None else (None, None, None)
    if peak is None:
        # No tracker ran (an imported trace, a run without the memory probe), but the steps carry
        # their peak: show it, with no breakdown rather than every category at 0 B beside it.
        categories_max = {}
        stepped = [s for s in state.steps.get(rank if rank is not None else min(state.steps, default=0), [])
                   if s.peak_memory_bytes is not None]
        top = max(stepped, key=lambda s: s.peak_memory_bytes or 0, default=None)
        if top is not None:
            peak_bytes, peak_step, source = top.peak_memory_bytes, top.index, "steps"
    section: dict[str, Any] = {
        "budget_bytes": budget_bytes,
        "peak_bytes": peak_bytes,
        "peak_step": peak_step,
        "peak_source": source,
        "categories_at_peak": categories_at_peak,
        "categories_max": categories_max,
        "timeline": timeline,
        # Light steps whose sample the agent folded into another's as the run grew (advisor/probes/
        # memory/light_series.py): 0 while every light step has its own.
        "light_steps_folded": sum(s.steps_covered - 1 for s in samples),
        "modules": modules,
        "module_time_scale": time_scale,
        "oom": _oom(state, rank),
    }
    cuda = _cuda(state, samples, rank)
    if cuda is not None:
        section["cuda"] = cuda
    return section


def _modules(state: SessionState, rank: int | None) -> list[dict[str, Any]]:
    latest: dict[str, ModuleStat] = {}
    for stat in state.modules:
        if stat.rank == rank and (stat.name not in latest or stat.step >= latest[stat.name].step):
            latest[stat.name] = stat
    inclusive: dict[tuple[int, str], int] = {}
    for event, activations in payloads(state.events, ModuleActivations):
        if event.rank == rank and event.step is not None:
            for name, nbytes in activations.inclusive_bytes.items():
                inclusive[(event.step, name)] = int(nbytes)
    rows = [
        {
            "name": s.name,
            "type": s.type,
            "depth": s.depth,
            "step": s.step,
            "parameter_bytes": s.parameter_bytes,
            "activation_bytes": s.activation_bytes,
            "activation_inclusive_bytes": inclusive.get((s.step, s.name)),
            "input_bytes": s.input_bytes,
            "output_bytes": s.output_bytes,
            "forward_s": s.forward_s,
            "backward_s": s.backward_s,
            "calls": s.calls,
            "live_calls": s.live_calls,
            "call_activation_bytes": s.call_activation_bytes,
            "call_input_bytes": s.call_input_bytes,
            "call_output_bytes": s.call_output_bytes,
            "checkpoint_freed_bytes": s.checkpoint_freed_bytes,
            "checkpoint_freed_late_bytes": s.checkpoint_freed_late_bytes,
        }
        for s in latest.values()
    ]
    rows.sort(key=lambda r: (-r["activation_bytes"], r["name"]))
    return rows


def _checkpointed(state: SessionState) -> set[str]:
    """Modules under activation checkpointing now: the last apply result decides (kept, or a
    later revert), so the module table can say why their saved activations dropped."""
    current: set[str] = set()
    for result in state.applied:
        if result.remedy != "activation_checkpointing":
            continue
        if isinstance(result, ApplyResult) and result.status == "kept":
            current = set(result.params.get("modules") or [])
        elif result.status in ("reverted", "failed"):
            current = set()
    return current


def _module_time_scale(state: SessionState, modules: list[dict[str, Any]]) -> dict[str, float]:
    """Factors from module times measured on deep steps to an ordinary step, per phase: the
    ordinary steps' median forward (backward) phase over the model's (module "") own forward
    (backward) time on the deep step, else the ordinary step over the deep steps' median time."""
    root = next((m for m in modules if m["name"] == ""), None)
    deep = [s.time_s for s in state.rank0_steps() if s.deep and s.time_s > 0]
    fallback = scale(light_step_time(state), statistics.median(deep) if deep else None)
    out = {}
    for phase in ("forward", "backward"):
        probed = root[f"{phase}_s"] if root else 0.0
        out[phase] = scale(light_phase_time(state, f"{phase}_s"), probed) if probed else fallback
    return out


def _oom(state: SessionState, rank: int | None) -> dict[str, Any] | None:
    ooms = [e for e in state.events if e.name == "oom"]
    if not ooms:
        return None
    mine = [e for e in ooms if e.rank == rank] or ooms
    event = mine[-1]
    return {"rank": event.rank, "step": event.step, **event.data}


def _cuda(state: SessionState, samples: list[MemorySample], rank: int | None) -> dict[str, Any] | None:
    allocated = [s.allocated_bytes for s in samples if s.allocated_bytes is not None]
    views = [e.data for e in state.events if e.name == "cuda_memory" and e.rank == rank]
    if not allocated and not views:
        return None
    reserved = [s.reserved_bytes for s in samples if s.reserved_bytes is not None]
    last = views[-1] if views else {}
    peak_reserved = max(reserved, default=None)
    peak_allocated = max(allocated, default=None)
    return {
        "peak_allocated_bytes": peak_allocated,
        "peak_reserved_bytes": peak_reserved,
        "reserved_minus_allocated_bytes": last.get("reserved_minus_allocated_bytes"),
        "alloc_retries": last.get("alloc_retries"),
        "device_used_bytes": last.get("device_used_bytes"),
        "device_used_outside_torch_bytes": last.get("device_used_outside_torch_bytes"),
    }


def memory_blocks(section: dict[str, Any]) -> list[Block]:
    """The breakdown at the peak, the heaviest modules, the OOM record if any (``advisor.blocks``)."""
    out: list[Block] = []
    peak = section.get("peak_bytes")
    budget = section.get("budget_bytes")
    title = f"Memory at peak: {fmt_bytes(peak)}"
    if section.get("peak_step") is not None:
        title += f" (step {section['peak_step']})"
    at_peak, maxima = section.get("categories_at_peak") or {}, section.get("categories_max") or {}
    budget_line = () if budget is None else (f"budget {fmt_bytes(budget)}",)
    if not at_peak and not any(maxima.values()):
        # No tracker ran: the steps' own peak, or nothing, never a column of 0 B beside it.
        what = ("the steps' own peak; no breakdown by category (no memory tracker ran)" if peak is not None
                else "no memory measured")
        out.append(Lines(title=title, lines=((what,), *((line,) for line in budget_line))))
    else:
        rows = tuple((category, fmt_bytes(at_peak.get(category)) if at_peak else MISSING,
                      fmt_bytes(maxima.get(category))) for category in MEMORY_CATEGORIES)
        out.append(Table(title=title, caption=budget_line[0] if budget_line else None,
                         columns=(Column(name="category", label=True), Column(name="at peak", numeric=True),
                                  Column(name="max", numeric=True)), rows=rows))
    modules = section.get("modules") or []
    if modules:
        k = section.get("module_time_scale") or {}
        caption = None
        if k.get("forward") and k["forward"] < 1:
            caption = (f"forward and backward per ordinary step; profiled steps ran "
                       f"{1 / k['forward']:.1f}x (forward) and {1 / max(k.get('backward') or 1, 1e-9):.1f}x "
                       "(backward) slower")
        out.append(Table(
            title="Heaviest modules (saved for backward)", caption=caption,
            columns=(Column(name="module", fold_at=48), Column(name="type"),
                     *(Column(name=c, numeric=True) for c in ("params", "activations", "input", "forward", "backward"))),
            rows=tuple((row["name"] or "(model)",
                        row.get("type", "") + (" (checkpointed)" if row.get("checkpointed") else ""),
                        fmt_bytes(row["parameter_bytes"]), fmt_bytes(row["activation_bytes"]),
                        fmt_bytes(row["input_bytes"]), fmt_seconds(row.get("light_forward_s", row["forward_s"])),
                        fmt_seconds(row.get("light_backward_s", row["backward_s"])))
                       for row in modules[:10])))
    oom = section.get("oom")
    if oom:
        items: list[tuple[str, Cell]] = [
            ("op", f"{oom.get('op') or '?'} in module {oom.get('module') or '?'}"),
            ("requested", f"{fmt_bytes(oom.get('requested_bytes'))} at step {oom.get('step')}"),
        ]
        cats = oom.get("categories") or {}
        if any(cats.values()):
            items.append(("held", ", ".join(f"{c} {fmt_bytes(v)}" for c, v in cats.items() if v)))
        for frame in (oom.get("frames") or [])[-3:]:
            items.append(("", f"  {frame['file']}:{frame['line']} in {frame['function']}: {frame['code']}"))
        if oom.get("snapshot_path"):
            items.append(("snapshot", f"{oom['snapshot_path']} (open in https://pytorch.org/memory_viz)"))
        out.append(Facts(title="Out of memory", items=tuple(items), border="red"))
    return out


def render_memory_section(section: dict[str, Any]) -> list[Any]:
    """Rich renderables of ``memory_blocks``."""
    return [to_rich(block) for block in memory_blocks(section)]
