"""The report's memory section: categories over time and at peak, heaviest modules, the OOM record.

``build_memory_section`` returns plain data (the JSON report's ``memory`` object, a public
contract); ``render_memory_section`` turns it into rich renderables (advisor/trace.py exports
the timeline as Chrome/Perfetto counter events).
"""

from __future__ import annotations

import statistics
from typing import Any

from advisor.sections.timebase import light_module_times, light_phase_time, light_step_time, scale
from advisor.state import SessionState
from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.records.results import ApplyResult
from advisor.records.samples import MEMORY_CATEGORIES, MemorySample, ModuleStat, rank_of_interest

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
    categories_max = {c: max((s.categories.get(c, 0) for s in samples), default=0) for c in MEMORY_CATEGORIES}
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
    section: dict[str, Any] = {
        "budget_bytes": budget_bytes,
        "peak_bytes": peak.total_bytes if peak is not None else None,
        "peak_step": peak.step if peak is not None else None,
        "categories_at_peak": categories_at_peak,
        "categories_max": categories_max,
        "timeline": timeline,
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
    for event in state.events:
        if event.name == "module_activations" and event.rank == rank and event.step is not None:
            for name, nbytes in (event.data.get("inclusive_bytes") or {}).items():
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


def render_memory_section(section: dict[str, Any]) -> list[Any]:
    """Rich renderables: the breakdown at peak, the heaviest modules, the OOM record if any."""
    from rich.panel import Panel
    from rich.table import Table

    out: list[Any] = []
    peak = section.get("peak_bytes")
    budget = section.get("budget_bytes")
    title = f"Memory at peak: {fmt_bytes(peak)}"
    if section.get("peak_step") is not None:
        title += f" (step {section['peak_step']})"
    table = Table(title=title, caption=None if budget is None else f"budget {fmt_bytes(budget)}")
    table.add_column("category", no_wrap=True)
    table.add_column("at peak", justify="right", no_wrap=True)
    table.add_column("max", justify="right", no_wrap=True)
    for category in MEMORY_CATEGORIES:
        at_peak = section.get("categories_at_peak", {}).get(category, 0)
        table.add_row(category, fmt_bytes(at_peak), fmt_bytes(section.get("categories_max", {}).get(category, 0)))
    out.append(table)
    modules = section.get("modules") or []
    if modules:
        heavy = Table(title="Heaviest modules (saved for backward)")
        longest = max((len(row["name"] or "(model)") for row in modules[:10]), default=0)
        for column in ("module", "type", "params", "activations", "input", "forward", "backward"):
            name_column = column in ("module", "type")
            heavy.add_column(column, justify="left" if name_column else "right", no_wrap=not name_column,
                             overflow="fold", min_width=min(longest, 48) if column == "module" else None)
        k = section.get("module_time_scale") or {}
        if k.get("forward") and k["forward"] < 1:
            heavy.caption = (f"forward and backward per ordinary step; profiled steps ran "
                             f"{1 / k['forward']:.1f}x (forward) and {1 / max(k.get('backward') or 1, 1e-9):.1f}x "
                             "(backward) slower")
        for row in modules[:10]:
            heavy.add_row(
                row["name"] or "(model)",
                row.get("type", "") + (" (checkpointed)" if row.get("checkpointed") else ""),
                fmt_bytes(row["parameter_bytes"]),
                fmt_bytes(row["activation_bytes"]),
                fmt_bytes(row["input_bytes"]),
                fmt_seconds(row.get("light_forward_s", row["forward_s"])),
                fmt_seconds(row.get("light_backward_s", row["backward_s"])),
            )
        out.append(heavy)
    oom = section.get("oom")
    if oom:
        lines = [
            f"op {oom.get('op') or '?'} in module {oom.get('module') or '?'}",
            f"requested {fmt_bytes(oom.get('requested_bytes'))} at step {oom.get('step')}",
        ]
        cats = oom.get("categories") or {}
        lines.append(", ".join(f"{c} {fmt_bytes(v)}" for c, v in cats.items() if v))
        for frame in (oom.get("frames") or [])[-3:]:
            lines.append(f"  {frame['file']}:{frame['line']} in {frame['function']}: {frame['code']}")
        if oom.get("snapshot_path"):
            lines.append(f"snapshot: {oom['snapshot_path']} (open in https://pytorch.org/memory_viz)")
        out.append(Panel("\n".join(lines), title="Out of memory", border_style="red"))
    return out
