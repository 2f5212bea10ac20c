"""The job before a remedy, after it, and after a revert: one measured summary per regime.

A session with an apply holds several jobs in one: the peak, the step time, the heaviest ops
and modules differ on either side of the boundary. This section splits the session at each
apply and revert (from the ``apply_started``, ``apply_result`` and ``apply_reverted`` events)
and summarises each stretch on its own, so a report never mixes a figure from before the remedy
with one from after it. Which regime the advice describes is decided elsewhere (advice).
"""

from __future__ import annotations

import copy
import statistics
from typing import Any, Mapping

from advisor.blocks import Block, Cell, Column, Table
from advisor.records.units import MISSING, fmt_bytes, fmt_seconds
from advisor.rich_text import to_rich
from advisor.sections.comm import build_comm_section
from advisor.sections.compute import build_ops_section
from advisor.sections.memory import build_memory_section
from advisor.sections.timebase import light_samples
from advisor.state import SessionState

TOP = 5


def boundaries(state: SessionState) -> list[tuple[int, str, str]]:
    """(first step, label, remedy) of each regime after the first, in step order."""
    out: list[tuple[int, str, str]] = []
    first_rank = min((e.rank for e in state.events), default=0)  # every rank applies at one boundary
    for event in state.events:
        data = event.data or {}
        remedy = str(data.get("remedy") or "remedy")
        if event.rank != first_rank:
            continue
        if event.name == "apply_started" and data.get("at_step") is not None:
            out.append((int(data["at_step"]), f"after {remedy}", remedy))
        elif event.name == "apply_result" and data.get("status") in ("reverted", "failed"):
            after = ((data.get("measured") or {}).get("after") or {}).get("steps") or []
            step = max(after) + 1 if after else (event.step if event.step is not None else None)
            if step is not None:
                out.append((int(step), f"after reverting {remedy}", remedy))
        elif event.name == "apply_reverted" and event.step is not None:
            out.append((int(event.step) + 1, f"after reverting {remedy}", remedy))
    return sorted(out, key=lambda b: b[0])


def slice_state(state: SessionState, first: int, end: int | None) -> SessionState:
    """The records of steps ``first <= step < end`` (``end`` None: to the last)."""
    def inside(step: int | None) -> bool:
        return step is not None and step >= first and (end is None or step < end)

    part = copy.copy(state)
    part.steps = {r: [s for s in samples if inside(s.index)] for r, samples in state.steps.items()}
    part.memory = [m for m in state.memory if inside(m.step)]
    part.modules = [m for m in state.modules if inside(m.step)]
    part.ops = [o for o in state.ops if inside(o.step)]
    part.collectives = [c for c in state.collectives if inside(c.step)]
    return part


def _summary(part: SessionState, label: str, first: int, last: int, spec: Mapping[str, Any] | None) -> dict[str, Any]:

    samples = part.rank0_steps()
    light = [s.time_s for s in light_samples(part)]
    profiled = [s.time_s for s in samples if s.deep and s.time_s > 0]
    # The regime's peak is its memory section's (the tracked total, else the steps' peaks), the
    # figure a diagnosis of the regime reads: the larger of the two read 8.52 MB beside a
    # diagnosis's 8.47 MB after a ZeRO-3 switch.
    memory = build_memory_section(part, budget_bytes=None)
    return {
        "label": label,
        "first_step": first,
        "last_step": last,
        "steps": len(samples),
        "peak_bytes": memory["peak_bytes"],
        "step_time_s": statistics.median(light) if light else None,
        "step_time_steps": len(light),
        # Only profiled steps in this regime (all deep-sampled): their time, labelled as such.
        "profiled_step_time_s": statistics.median(profiled) if profiled else None,
        "top_ops": [{"name": o["name"], "module": o["module"], "phase": o["phase"], "time_s": o["time_s"]}
                    for o in build_ops_section(part, spec)[:TOP]],
        "top_modules": [{"name": m["name"], "activation_bytes": m["activation_bytes"],
                         "light_forward_s": m.get("light_forward_s")}
                        for m in memory["modules"][:TOP]],
        # The comm section's rows over this regime's steps only: what the advice quotes after an apply.
        "comm": build_comm_section(part) if part.collectives else [],
    }


def build_regimes_section(state: SessionState, spec: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One summary per regime; empty when the session had no apply (one regime: the report)."""
    cuts = boundaries(state)
    if not cuts:
        return []
    indices = [s.index for s in state.rank0_steps()]
    if not indices:
        return []
    starts = [(min(indices), "before any remedy", "")] + cuts
    out = []
    for i, (first, label, _) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else None
        part = slice_state(state, first, end)
        steps = [s.index for s in part.rank0_steps()]
        if not steps:
            continue  # a plan applied before step 0 leaves no "before"
        out.append(_summary(part, label, first, max(steps), spec))
    return out


def regimes_blocks(regimes: list[dict[str, Any]]) -> list[Block]:
    """One table row per regime with its heaviest ops and modules (``advisor.blocks``)."""
    if not regimes:
        return []
    rows = []
    for r in regimes:
        ops = tuple(f"{o['name']} {fmt_seconds(o['time_s'])}" for o in r["top_ops"][:3]) or MISSING
        modules = tuple(f"{m['name'] or '(model)'} {fmt_bytes(m['activation_bytes'])}"
                        for m in r["top_modules"][:3]) or MISSING
        step_time: Cell = fmt_seconds(r["step_time_s"])
        if r["step_time_s"] is None and r.get("profiled_step_time_s") is not None:
            step_time = (fmt_seconds(r["profiled_step_time_s"]), "(profiled steps)")
        rows.append((r["label"], f"{r['first_step']}-{r['last_step']}", fmt_bytes(r["peak_bytes"]), step_time, ops,
                     modules))
    return [Table(
        title="The job before and after each remedy (each measured on its own steps)",
        caption="step time: the median of the regime's ordinary steps",
        columns=(Column(name="regime"), Column(name="steps", label=True), Column(name="peak", numeric=True),
                 Column(name="step time", numeric=True), Column(name="top ops (per ordinary step)"),
                 Column(name="heaviest modules")),
        rows=tuple(rows))]


def render_regimes(regimes: list[dict[str, Any]]) -> list[Any]:
    """Rich renderables of ``regimes_blocks``."""
    return [to_rich(block) for block in regimes_blocks(regimes)]
