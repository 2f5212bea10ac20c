"""What a tracker receives, read off the report (pure, torch-free): the step-time and memory
series, each apply's predicted and measured figures, and the findings as text.

Names are the same in every tool: ``advisor/step_time_s``, ``advisor/loss``,
``advisor/peak_memory_bytes``, ``advisor/phase/<phase>_s`` per step (with ``rank<R>/`` after
``advisor/`` for ranks other than the lowest), and per apply, at its step,
``advisor/apply/<recommendation id>/{predicted,measured}_{step_time_s,peak_memory_bytes}``.
Every figure is the report's own: the series are ``steps[]``, the applies ``applied[]``
(``measured.after``: the mean of the light steps at the end of the executor's window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

PREFIX = "advisor"


@dataclass(frozen=True, kw_only=True)
class TrackerData:
    """Everything logged for one session."""

    session_id: str
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> name -> value
    summary: dict[str, float | str] = field(default_factory=dict)  # the session's headline figures
    findings: str = ""  # Markdown: diagnosis, recommendations, applies
    recommendations: list[list[Any]] = field(default_factory=list)  # rows under RECOMMENDATION_COLUMNS
    applies: list[list[Any]] = field(default_factory=list)  # rows under APPLY_COLUMNS


RECOMMENDATION_COLUMNS = ["id", "remedy", "apply_class", "predicted_step_time_s", "baseline_step_time_s",
                          "predicted_peak_memory_bytes", "baseline_peak_memory_bytes", "fits", "confidence"]
APPLY_COLUMNS = ["recommendation_id", "remedy", "rank", "at_step", "status", "predicted_step_time_s",
                 "measured_step_time_s", "predicted_peak_memory_bytes", "measured_peak_memory_bytes"]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _put(metrics: dict[int, dict[str, float]], step: int, name: str, value: Any) -> None:
    number = _number(value)
    if number is not None:
        metrics.setdefault(step, {})[name] = number


def tracker_data(report: dict[str, Any]) -> TrackerData:
    """The report's series, applies and findings, as every tracker logs them."""
    metrics: dict[int, dict[str, float]] = {}
    steps = [s for s in report.get("steps") or [] if isinstance(s, dict) and isinstance(s.get("index"), int)]
    first_rank = min((s.get("rank", 0) for s in steps), default=0)
    for sample in steps:
        rank = sample.get("rank", 0)
        base = PREFIX if rank == first_rank else f"{PREFIX}/rank{rank}"
        step = sample["index"]
        _put(metrics, step, f"{base}/step_time_s", sample.get("time_s"))
        _put(metrics, step, f"{base}/loss", sample.get("loss"))
        _put(metrics, step, f"{base}/peak_memory_bytes", sample.get("peak_memory_bytes"))
        _put(metrics, step, f"{base}/device_time_s", sample.get("device_time_s"))
        for phase, seconds in (sample.get("phases") or {}).items():
            _put(metrics, step, f"{base}/phase/{phase}", seconds)
    applies = []
    for entry in report.get("applied") or []:
        rec_id = str(entry.get("recommendation_id") or entry.get("remedy") or "remedy")
        predicted = entry.get("predicted") or {}
        after = (entry.get("measured") or {}).get("after") or {}
        at_step = entry.get("at_step")
        row = [rec_id, entry.get("remedy"), entry.get("rank"), at_step, entry.get("status"),
               _number(predicted.get("step_time_s")), _number(after.get("step_time_s")),
               _number(predicted.get("peak_memory_bytes")), _number(after.get("peak_memory_bytes"))]
        applies.append(row)
        if isinstance(at_step, int) and entry.get("rank", first_rank) == first_rank:  # the table has every rank
            name = f"{PREFIX}/apply/{rec_id}"
            _put(metrics, at_step, f"{name}/predicted_step_time_s", row[5])
            _put(metrics, at_step, f"{name}/measured_step_time_s", row[6])
            _put(metrics, at_step, f"{name}/predicted_peak_memory_bytes", row[7])
            _put(metrics, at_step, f"{name}/measured_peak_memory_bytes", row[8])
    recommendations = [[r.get("id"), r.get("remedy"), r.get("apply_class"),
                        _number((r.get("predicted") or {}).get("step_time_s")),
                        _number((r.get("baseline") or {}).get("step_time_s")),
                        _number((r.get("predicted") or {}).get("peak_memory_bytes")),
                        _number((r.get("baseline") or {}).get("peak_memory_bytes")), r.get("fits"), r.get("confidence")]
                       for r in report.get("recommendations") or []]
    return TrackerData(session_id=str((report.get("session") or {}).get("id") or "session"), metrics=metrics,
                       summary=_summary(report), findings=findings_markdown(report),
                       recommendations=recommendations, applies=applies)


def _summary(report: dict[str, Any]) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    diagnosis = report.get("diagnosis") or {}
    if diagnosis.get("bottleneck"):
        out[f"{PREFIX}/bottleneck"] = str(diagnosis["bottleneck"])
    recs = report.get("recommendations") or []
    if recs:
        out[f"{PREFIX}/top_recommendation"] = str(recs[0].get("id"))
    memory = report.get("memory") or {}
    for key in ("peak_bytes", "budget_bytes"):
        number = _number(memory.get(key))
        if number is not None:
            out[f"{PREFIX}/memory_{key}"] = number
    for key, value in (report.get("summary") or {}).items():
        number = _number(value)
        if number is not None:
            out[f"{PREFIX}/summary/{key}"] = number
    return out


def findings_markdown(report: dict[str, Any]) -> str:
    """The diagnosis, the recommendations and the applies, as a tracker's text panel shows them."""
    lines = [f"# advisor session {(report.get('session') or {}).get('id')}", ""]
    diagnosis = report.get("diagnosis")
    if diagnosis:
        lines += [f"**Diagnosis: {diagnosis.get('bottleneck')}**: {diagnosis.get('summary')}", ""]
        lines += [f"- {e.get('what')}: {e.get('value')}" + (f" (threshold {e['threshold']})" if "threshold" in e else "")
                  for e in diagnosis.get("evidence") or [] if isinstance(e, dict)]
        lines.append("")
    else:
        lines += ["No diagnosis: nothing was measured deeply.", ""]
    recs = report.get("recommendations") or []
    if recs:
        lines += ["## Recommendations (best first)", "", "| id | apply class | predicted step s | predicted peak bytes |",
                  "|---|---|---|---|"]
        for rec in recs:
            predicted = rec.get("predicted") or {}
            lines.append(f"| {rec.get('id')} | {rec.get('apply_class')} | {predicted.get('step_time_s')} | "
                         f"{predicted.get('peak_memory_bytes')} |")
        lines.append("")
    applied = report.get("applied") or []
    if applied:
        lines += ["## Applied (predicted against measured: the mean of the window's last light steps)", "",
                  "| id | at step | status | predicted step s | measured step s |", "|---|---|---|---|---|"]
        for entry in applied:
            after = (entry.get("measured") or {}).get("after") or {}
            lines.append(f"| {entry.get('recommendation_id')} | {entry.get('at_step')} | {entry.get('status')} | "
                         f"{(entry.get('predicted') or {}).get('step_time_s')} | {after.get('step_time_s')} |")
    return "\n".join(lines).rstrip() + "\n"
