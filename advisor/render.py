"""The rich rendering of a report (``advisor report``, end of ``attach --headless``)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from advisor.phrases import applied_time_line, calibration_line, exit_line
from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.report_markdown import report_markdown
from advisor.sections.comm import render_comm_sections
from advisor.sections.compute import render_compute_section
from advisor.sections.links import render_links_section
from advisor.sections.memory import render_memory_section
from advisor.sections.regimes import render_regimes


def _t(value: Any) -> str:
    """A user-provided string (script path, exception text, ...) made safe to paste into markup."""
    return escape(str(value))


def _run_panel(report: dict[str, Any]) -> Panel:
    run = report["run"]
    summary = report.get("summary", {})
    exit_ = run.get("exit", {})
    lines = [
        f"[b]script[/b] {_t(run.get('script'))} {_t(' '.join(str(a) for a in run.get('argv') or []))}",
        f"[b]device[/b] {_t(run['device'].get('type'))} · {_t(run['device'].get('name'))} · world size {run.get('world_size')}",
        f"[b]steps[/b] {summary.get('steps', 0)}"
        + (f" · median {fmt_seconds(summary['median_step_s'])}/step" if summary.get("median_step_s") else "")
        + (f" · last loss {summary['last_loss']:.4f}" if isinstance(summary.get("last_loss"), float) else ""),
        f"[b]exit[/b] {_t(exit_line(exit_))}",
    ]
    job = report.get("job") or {}
    if job.get("launcher") in ("torchrun", "env"):  # a multi-node job: which part of it this is
        sessions = job.get("sessions") or []
        lines.append(f"[b]job[/b] {_t(job.get('id'))} · ranks {job.get('ranks')}"
                     + (f" · merged from {len(sessions)} sessions: "
                        + ", ".join(f"{_t(s.get('id'))} (ranks {s.get('ranks')}{', decides' if s.get('decides') else ''})"
                                    for s in sessions) if job.get("merged") else ""))
    for model in run.get("models", []):
        lines.append(f"[b]model[/b] {_t(model['name'])}" + (f" in {_t(model['wrapper'])}" if model.get("wrapper") else "")
                     + f" · {model['parameter_count']:,} parameters ({fmt_bytes(model['parameter_bytes'])})")
    return Panel("\n".join(lines), title=f"session {_t(report['session']['id'])}", expand=False)


def _phase_table(report: dict[str, Any]) -> Table | None:
    share = report.get("summary", {}).get("phase_share")
    if not share:
        return None
    table = Table(title="where a step's time goes (steady state)", expand=False)
    for key in share:
        table.add_column(key[:-2], justify="right")
    table.add_row(*(f"{100 * v:.1f}%" for v in share.values()))
    return table


def _advice_panel(report: dict[str, Any]) -> Panel | None:
    diagnosis = report.get("diagnosis")
    if not diagnosis:
        return None
    lines = [f"[b]bottleneck[/b] {_t(diagnosis.get('bottleneck'))} · {_t(diagnosis.get('summary', ''))}"]
    for rec in report.get("recommendations") or []:
        predicted = rec.get("predicted") or {}
        lines.append(f"  [b]{_t(rec['id'])}[/b] {_t(rec.get('title') or rec['remedy'])} → peak "
                     f"{fmt_bytes(predicted.get('peak_memory_bytes'))}, step "
                     f"{fmt_seconds(predicted.get('step_time_s'))}"
                     + ("" if rec.get("live", True) else " (not live)")
                     + (f" · {calibration_line(rec)}" if calibration_line(rec) else ""))
    for applied in report.get("applied") or []:
        after = (applied.get("measured") or {}).get("after") or {}
        predicted = applied.get("predicted") or {}
        lines.append(f"  applied {_t(applied.get('remedy'))} at step {applied.get('at_step')}: "
                     f"[b]{_t(applied.get('status'))}[/b] · peak predicted {fmt_bytes(predicted.get('peak_memory_bytes'))} "
                     f"measured {fmt_bytes(after.get('peak_memory_bytes'))}"
                     + (f" · {applied_time_line(applied)}" if applied_time_line(applied) else "")
                     + (f" · error: {_t(applied['error'])}" if applied.get("error") else ""))
    return Panel("\n".join(lines), title="diagnosis", expand=False)


def report_renderables(report: dict[str, Any]) -> list[Any]:
    parts: list[Any] = [_run_panel(report)]
    phases = _phase_table(report)
    if phases is not None:
        parts.append(phases)
    for name, render, keys in (
        ("memory", render_memory_section, ("memory",)),
        ("compute", render_compute_section, ("ops", "compute")),
        ("comm", render_comm_sections, ("collectives", "comm", "straggler")),
        ("regimes", render_regimes, ("regimes",)),
        ("comm_links", render_links_section, ("comm_links",)),
    ):
        if not any(report.get(k) for k in keys):
            continue
        try:
            parts.extend(render(*(report.get(k) for k in keys)))
        except Exception as exc:  # noqa: BLE001 - a rendering problem must not hide the rest
            parts.append(Text(f"could not render {name}: {type(exc).__name__}: {exc}", style="red"))
    advice = _advice_panel(report)
    if advice is not None:
        parts.append(advice)
    for warning in report.get("warnings") or []:
        parts.append(Text.assemble(("warning:", "yellow"), f" {warning}"))
    return parts


PIPE_WIDTH = 120  # a CI log or a pipe has no width; wide enough that names are never squeezed


def report_console(stream: TextIO) -> Console:
    """A console for ``stream``: its own width on a terminal, else ``COLUMNS`` but at least 120
    (CI runners often say 80, which would squeeze op and module names)."""
    if stream.isatty():
        return Console(file=stream)
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        width = 0
    return Console(file=stream, width=max(width, PIPE_WIDTH), color_system=None)


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    (console or report_console(sys.stdout)).print(Group(*report_renderables(report)))


def emit_report(report: dict[str, Any], fmt: str, stream: TextIO) -> None:
    """The whole report on ``stream`` as ``text`` (rich), ``json`` or ``markdown``."""
    if fmt == "json":
        json.dump(report, stream, indent=1, allow_nan=False, default=str)
        stream.write("\n")
    elif fmt == "markdown":
        stream.write(report_markdown(report))
    else:
        print_report(report, report_console(stream))
    stream.flush()


def print_exit_summary(report: dict[str, Any], console: Console | None = None) -> None:
    """After the TUI closes: the run panel and the diagnosis only."""
    parts: list[Any] = [_run_panel(report)]
    advice = _advice_panel(report)
    if advice is not None:
        parts.append(advice)
    (console or report_console(sys.stderr)).print(Group(*parts))
