"""Every section of a report as blocks (``advisor.blocks``), in the order a reader meets them.

``report_sections`` is the one list both renderers walk: the rich report (``advisor.render``)
and the Markdown report (``advisor.report_markdown``), so the Markdown of a session with a kept
remedy shows it as the terminal does. No torch; the blocks hold no rich object.
"""

from __future__ import annotations

from typing import Any, Callable

from advisor.blocks import Block, Cell, Column, Facts, Lines, Section, Span, Table
from advisor.phrases import applied_time_line, calibration_line, exit_line, predicted_step
from advisor.records.remedy import applied_name
from advisor.records.units import MISSING, fmt_bytes, fmt_quantity, fmt_seconds
from advisor.sections.comm import comm_blocks
from advisor.sections.compute import compute_blocks
from advisor.sections.links import links_blocks
from advisor.sections.memory import memory_blocks
from advisor.sections.regimes import regimes_blocks

PHASE_NAMES = ("data", "forward", "backward", "optimizer", "other")


def run_block(report: dict[str, Any]) -> Facts:
    """The run: script, device, steps, exit, the job it is part of, its models (once per kind)."""
    run, summary = report.get("run") or {}, report.get("summary") or {}
    device, exit_ = run.get("device") or {}, run.get("exit") or {}
    steps = f"{summary.get('steps', 0)}"
    if summary.get("median_step_s"):
        steps += f" · median {fmt_seconds(summary['median_step_s'])}/step (ordinary steps)"
    if isinstance(summary.get("last_loss"), float):
        steps += f" · last loss {summary['last_loss']:.4f}"
    items: list[tuple[str, Cell]] = [
        ("script", " ".join([str(run.get("script")), *(str(a) for a in run.get("argv") or [])])),
        ("device", f"{device.get('type')} · {device.get('name')} · world size {run.get('world_size')}"),
        ("steps", steps),
        ("exit", exit_line(exit_)),
    ]
    job = report.get("job") or {}
    if job.get("launcher") in ("torchrun", "env"):  # a multi-node job: which part of it this is
        sessions = job.get("sessions") or []
        line = f"{job.get('id')} · ranks {job.get('ranks')}"
        if job.get("merged"):
            line += f" · merged from {len(sessions)} sessions: " + ", ".join(
                f"{s.get('id')} (ranks {s.get('ranks')}{', decides' if s.get('decides') else ''})" for s in sessions)
        items.append(("job", line))
    for model, ranks in _models(run.get("models") or []):
        line = (f"{model['name']}" + (f" in {model['wrapper']}" if model.get("wrapper") else "")
                + f" · {model['parameter_count']:,} parameters ({fmt_bytes(model['parameter_bytes'])})")
        if len(ranks) > 1:
            line += f" · on {len(ranks)} ranks"
        items.append(("model", line))
    return Facts(title=f"session {(report.get('session') or {}).get('id')}", items=tuple(items))


def _models(models: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[int]]]:
    """Each model once with the ranks that built it: a 2-rank DDP job printed its model twice."""
    seen: dict[tuple[Any, ...], tuple[dict[str, Any], list[int]]] = {}
    for model in models:
        key = (model.get("label"), model.get("name"), model.get("wrapper"), model.get("parameter_count"))
        seen.setdefault(key, (model, []))[1].append(int(model.get("rank") or 0))
    return list(seen.values())


def phases_block(report: dict[str, Any]) -> Table | None:
    """Where a steady step's time goes: each phase's share and its mean seconds, which add up to
    the mean step (``summary.phase_fraction``, ``summary.phase_mean_s``)."""
    summary = report.get("summary") or {}
    fraction = summary.get("phase_fraction") or {k[:-2]: v for k, v in (summary.get("phase_share") or {}).items()}
    if not fraction:
        return None
    mean = summary.get("mean_step_s")
    names = [k for k in PHASE_NAMES if k in fraction] + [k for k in fraction if k not in PHASE_NAMES]
    rows: list[tuple[Cell, ...]] = [("share", *(f"{100 * fraction[k]:.1f}%" for k in names))]
    if mean is not None:
        rows.append(("mean", *(fmt_seconds(fraction[k] * mean) for k in names)))
    caption = None
    if mean is not None:
        caption = (f"steady steps (not step 0, not deep-sampled, not right after a deep one): the phases add up to the mean step "
                   f"{fmt_seconds(mean)}; the median step is {fmt_seconds(summary.get('median_step_s'))}")
    return Table(title="where a step's time goes (steady state)", caption=caption,
                 columns=(Column(name="", label=True), *(Column(name=k, numeric=True) for k in names)),
                 rows=tuple(rows))


def diagnosis_blocks(report: dict[str, Any]) -> list[Block]:
    """The diagnosis with its evidence, the recommendations, the applied remedies."""
    out: list[Block] = []
    diagnosis = report.get("diagnosis")
    if diagnosis:
        items: list[tuple[str, Cell]] = [("bottleneck", f"{diagnosis.get('bottleneck')} · {diagnosis.get('summary', '')}")]
        steps = diagnosis.get("steps") or {}
        if report.get("regimes") and steps:  # after an apply the advice describes the job as it runs now
            items.append(("steps", f"{steps.get('first')}-{steps.get('last')} (the job as it runs now)"))
        for item in diagnosis.get("evidence") or []:
            if isinstance(item, dict):
                items.append(("", f"  {item.get('what')}: {fmt_quantity(item.get('value'), item.get('unit'))}"))
            else:
                items.append(("", f"  {item}"))
        out.append(Facts(title="diagnosis", items=tuple(items)))
    recs = report.get("recommendations") or []
    if recs:
        out.append(Table(
            title="Recommendations",
            columns=(Column(name="id", label=True), Column(name="remedy"), Column(name="predicted peak", numeric=True),
                     Column(name="predicted step"), Column(name="live", label=True)),
            rows=tuple((str(r.get("id")), rec_title(r),
                        fmt_bytes((r.get("predicted") or {}).get("peak_memory_bytes")),
                        predicted_step(r) + (f" ({calibration_line(r)})" if calibration_line(r) else ""),
                        "yes" if r.get("live") and r.get("applicable", True) else "no")
                       for r in recs)))
    applied = report.get("applied") or []
    if applied:
        rows = []
        for entry in applied:
            after = (entry.get("measured") or {}).get("after") or {}
            predicted = entry.get("predicted") or {}
            status = str(entry.get("status") or "")
            style = "green" if status == "kept" else "red" if status in ("reverted", "failed") else ""
            why = entry.get("error") or entry.get("reason") or ""
            name = applied_name(entry.get("remedy"), entry.get("recommendation_id"))
            rows.append((name, str(entry.get("at_step")),
                         Span(text=status, style=style),
                         f"{fmt_bytes(predicted.get('peak_memory_bytes'))} → {fmt_bytes(after.get('peak_memory_bytes'))}",
                         applied_time_line(entry) or MISSING, str(why)))
        out.append(Table(
            title="Applied remedies",
            caption="peak: predicted → measured (the largest of the window's peaks); step: the window's mean "
                    "over steps of one kind",
            columns=(Column(name="remedy"), Column(name="at step", numeric=True), Column(name="status", label=True),
                     Column(name="peak"), Column(name="step time"), Column(name="why")),
            rows=tuple(rows)))
    return out


def warnings_block(report: dict[str, Any]) -> Lines | None:
    warnings = report.get("warnings") or []
    if not warnings:
        return None
    return Lines(title="Warnings", lines=tuple((Span(text="warning:", style="yellow"), f" {w}") for w in warnings))


def _section(name: str, build: Callable[[], list[Block]]) -> Section:
    try:
        return Section(name=name, blocks=tuple(build()))
    except Exception as exc:  # noqa: BLE001 - a rendering problem must not hide the rest
        line = (Span(text=f"could not render {name}: {type(exc).__name__}: {exc}", style="red"),)
        return Section(name=name, blocks=(Lines(lines=(line,)),))


def report_sections(report: dict[str, Any], *, top: int = 10) -> list[Section]:
    """The report's sections in reading order; a section that fails to render says so instead."""
    phases = phases_block(report)
    out = [_section("run", lambda: [run_block(report)]),
           _section("phases", lambda: [phases] if phases else [])]
    if report.get("memory"):
        out.append(_section("memory", lambda: memory_blocks(report["memory"])))
    if report.get("ops") or report.get("compute"):
        out.append(_section("compute", lambda: compute_blocks(report.get("ops") or [], report.get("compute") or {},
                                                              top=top)))
    if any(report.get(k) for k in ("collectives", "comm", "straggler")):
        out.append(_section("comm", lambda: comm_blocks(report.get("collectives") or [], report.get("comm") or [],
                                                        report.get("straggler"))))
    out.append(_section("regimes", lambda: regimes_blocks(report.get("regimes") or [])))
    out.append(_section("comm_links", lambda: links_blocks(report.get("comm_links"))))
    out.append(_section("advice", lambda: diagnosis_blocks(report)))
    warnings = warnings_block(report)
    out.append(_section("warnings", lambda: [warnings] if warnings else []))
    return [s for s in out if s.blocks]


def exit_sections(report: dict[str, Any]) -> list[Section]:
    """After the TUI closes: the run and the advice only."""
    return [s for s in (_section("run", lambda: [run_block(report)]), _section("advice", lambda: diagnosis_blocks(report)))
            if s.blocks]


def rec_title(rec: dict[str, Any]) -> str:
    """A recommendation's title, and why it cannot apply to this job where its check said so."""
    title = str(rec.get("title") or rec.get("remedy") or "")
    parts = [p for p in rec.get("parts") or [] if isinstance(p, dict)]
    if parts:  # a joint plan: what each part would do alone, beside the whole's columns
        title += " · alone: " + "; ".join(
            f"{p.get('id')} peak {fmt_bytes((p.get('predicted') or {}).get('peak_memory_bytes'))}" for p in parts)
    return title if rec.get("applicable", True) else f"{title} · not applicable: {rec.get('why')}"
