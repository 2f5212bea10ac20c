"""The report as Markdown (``--format markdown``): for CI logs, pull requests and issues.

Same figures and units as the rich report (``advisor.records.units``); names are never cut.
"""

from __future__ import annotations

from typing import Any, Iterable

from advisor.phrases import calibration_line, exit_line
from advisor.records.units import fmt_bytes, fmt_quantity, fmt_seconds
from advisor.sections.compute import fmt_roof, roof_footnote, time_base_note


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return lines + [""]


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def report_markdown(report: dict[str, Any], *, top: int = 10) -> str:

    run, summary = report.get("run") or {}, report.get("summary") or {}
    device = run.get("device") or {}
    out = [f"# advisor report: session {report.get('session', {}).get('id')}", ""]
    command = " ".join([str(run.get("script")), *(run.get("argv") or [])])
    out += [f"- script: `{command}`",
            f"- device: {device.get('type')} · {device.get('name')} · world size {run.get('world_size')}",
            f"- steps: {summary.get('steps', 0)} · median {fmt_seconds(summary.get('median_step_s'))}/step"
            + (f" · last loss {summary['last_loss']:.4f}" if isinstance(summary.get("last_loss"), float) else ""),
            f"- exit: {exit_line(run.get('exit') or {})}", ""]
    memory = report.get("memory") or {}
    if memory:
        out += [f"## Memory at peak: {fmt_bytes(memory.get('peak_bytes'))}"
                + (f" (budget {fmt_bytes(memory['budget_bytes'])})" if memory.get("budget_bytes") else ""), ""]
        cats = memory.get("categories_at_peak") or {}
        out += _table(("category", "at peak", "max"),
                      ((c, fmt_bytes(v), fmt_bytes((memory.get("categories_max") or {}).get(c))) for c, v in cats.items()))
        modules = memory.get("modules") or []
        if modules:
            out += ["### Heaviest modules (forward, backward per ordinary step)", ""]
            out += _table(("module", "type", "params", "activations", "forward", "backward"),
                          ((m["name"] or "(model)", m.get("type", ""), fmt_bytes(m.get("parameter_bytes")),
                            fmt_bytes(m.get("activation_bytes")),
                            fmt_seconds(m.get("light_forward_s", m.get("forward_s"))),
                            fmt_seconds(m.get("light_backward_s", m.get("backward_s")))) for m in modules[:top]))
    compute, ops = report.get("compute") or {}, report.get("ops") or []
    if ops:
        out += ["## Top ops by time (per ordinary step)", "",
                f"MFU {_pct(compute.get('mfu'))}; ops {fmt_seconds(compute.get('op_time_s'))} of a "
                f"{fmt_seconds(compute.get('step_time_s'))} step; {time_base_note(compute)}", ""]
        out += _table(("op", "module", "phase", "time", "profiled", "bound", "of roof"),
                      ((o["name"], o.get("module") or "(root)", o.get("phase", ""), fmt_seconds(o.get("time_s")),
                        fmt_seconds(o.get("profiled_time_s")), o.get("bound") or "—", fmt_roof(o, "—"))
                       for o in ops[:top]))
        footnote = roof_footnote(ops[:top])
        if footnote:
            out += [footnote, ""]
    diagnosis = report.get("diagnosis")
    if diagnosis:
        out += [f"## Diagnosis: {diagnosis.get('bottleneck')}", "", diagnosis.get("summary") or "", ""]
        for item in diagnosis.get("evidence") or []:
            if isinstance(item, dict):
                out.append(f"- {item.get('what')}: {fmt_quantity(item.get('value'), item.get('unit'))}")
            else:
                out.append(f"- {item}")
        out.append("")
    recs = report.get("recommendations") or []
    if recs:
        out += ["## Recommendations", ""]
        out += _table(("id", "remedy", "predicted peak", "predicted step", "live"),
                      ((r["id"], r.get("title") or r["remedy"], fmt_bytes((r.get("predicted") or {}).get("peak_memory_bytes")),
                        fmt_seconds((r.get("predicted") or {}).get("step_time_s"))
                        + (f" ({calibration_line(r)})" if calibration_line(r) else ""),
                        "yes" if r.get("live") else "no")
                       for r in recs))
    for warning in report.get("warnings") or []:
        out.append(f"> warning: {warning}")
    return "\n".join(out).rstrip() + "\n"
