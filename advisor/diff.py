"""``advisor diff A B``: what changed between two sessions, and the CI gate on it.

Torch-free and render-free: ``compute_diff`` takes each session's ``SessionState`` and its
report (``advisor.report.build_report``) and returns the ``advisor.diff/1`` document
(docs/report-schema.md); ``parse_gate`` and ``check_gate`` turn ``--fail-on`` into data.
Every change is ``{"a", "b", "abs": b - a, "rel": (b - a) / a}`` (``rel`` None when a is 0 or
either side is missing). Times are seconds per step, sizes bytes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping

from advisor.records.samples import MEMORY_CATEGORIES, PHASES, rank_of_interest
from advisor.records.units import fmt_bytes, fmt_seconds, parse_size
from advisor.state import SessionState

SCHEMA = "advisor.diff/1"

# Gate metric -> (unit, description). Values come from ``metric_values``.
METRICS: dict[str, tuple[str, str]] = {
    "step_time": ("s", "median steady-state step time"),
    "peak_memory": ("bytes", "peak memory (tracked categories, else the allocator's peak)"),
    "data_time": ("s", "mean data-loading time per step"),
    "forward_time": ("s", "mean forward time per step"),
    "backward_time": ("s", "mean backward time per step"),
    "optimizer_time": ("s", "mean optimizer time per step"),
    "exposed_comm": ("s", "mean exposed communication per step"),
    "comm_time": ("s", "mean communication time per step"),
}


def change(a: float | int | None, b: float | int | None) -> dict[str, Any]:
    """``{"a", "b", "abs", "rel"}``; ``abs``/``rel`` are None when a side is missing."""
    if a is None or b is None:
        return {"a": a, "b": b, "abs": None, "rel": None}
    return {"a": a, "b": b, "abs": b - a, "rel": (b - a) / a if a else None}


def _session(state: SessionState, report: Mapping[str, Any]) -> dict[str, Any]:
    run = report.get("run") or {}
    first = state.runs.get(0) or (state.runs[min(state.runs)] if state.runs else None)
    imported = (first.config.get("imported_from") if first else None)
    return {"id": state.session_id, "path": state.session_path, "script": run.get("script"),
            "world_size": run.get("world_size"), "imported_from": imported,
            "steps": (report.get("summary") or {}).get("steps", 0),
            "ranks": run.get("ranks"), "job": (report.get("job") or {}).get("id")}


def _phases(report: Mapping[str, Any]) -> dict[str, float | None]:
    summary = report.get("summary") or {}
    share, mean = summary.get("phase_share"), summary.get("mean_step_s")
    if not share or mean is None:
        return dict.fromkeys(PHASES)
    return {k: share.get(k, 0.0) * mean for k in PHASES}


def peak_memory(report: Mapping[str, Any]) -> int | None:
    """Tracked peak (memory section), else the allocator peak, else the steps' recorded peaks."""
    memory = report.get("memory") or {}
    if memory.get("peak_bytes") is not None:
        return int(memory["peak_bytes"])
    cuda = memory.get("cuda") or {}
    if cuda.get("peak_allocated_bytes") is not None:
        return int(cuda["peak_allocated_bytes"])
    peaks = [s["peak_memory_bytes"] for s in report.get("steps") or [] if s.get("peak_memory_bytes") is not None]
    return max(peaks) if peaks else None


def _comm(report: Mapping[str, Any], key: str) -> float | None:
    rows = report.get("comm") or []
    return sum(r[key] for r in rows) / len(rows) if rows else None


def metric_values(report: Mapping[str, Any]) -> dict[str, float | None]:
    phases = _phases(report)
    return {
        "step_time": (report.get("summary") or {}).get("median_step_s"),
        "peak_memory": peak_memory(report),
        "data_time": phases["data_s"], "forward_time": phases["forward_s"],
        "backward_time": phases["backward_s"], "optimizer_time": phases["optimizer_s"],
        "exposed_comm": _comm(report, "exposed_s"), "comm_time": _comm(report, "comm_s"),
    }


def _ops_per_step(state: SessionState) -> dict[tuple[str, str], dict[str, float]]:
    """(op name, phase) -> time and calls per step, averaged over the steps that recorded ops."""
    rank = rank_of_interest({o.rank for o in state.ops})
    ops = [o for o in state.ops if o.rank == rank]
    steps = len({o.step for o in ops}) or 1
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: {"time_s": 0.0, "count": 0.0})
    for o in ops:
        row = out[(o.name, o.phase)]
        row["time_s"] += o.time_s / steps
        row["count"] += o.count / steps
    return out


def _collectives_per_step(state: SessionState) -> dict[str, dict[str, float]]:
    """op -> calls, bytes, time and exposed time per step, on the rank of interest."""
    rank = rank_of_interest({c.rank for c in state.collectives})
    calls = [c for c in state.collectives if c.rank == rank]
    steps = len(state.steps.get(rank, [])) if rank is not None else 0
    steps = steps or len({c.step for c in calls}) or 1
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0.0, "bytes": 0.0, "time_s": 0.0,
                                                            "exposed_s": 0.0})
    for c in calls:
        row = out[c.op]
        row["count"] += c.count / steps
        row["bytes"] += c.bytes * c.count / steps
        row["time_s"] += c.time_s / steps
        row["exposed_s"] += c.exposed_s / steps
    return out


def _advice(report: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    diagnosis = report.get("diagnosis")
    brief = ({"bottleneck": diagnosis.get("bottleneck"), "summary": diagnosis.get("summary")}
             if isinstance(diagnosis, Mapping) else None)
    recs = [{"id": r.get("id"), "title": r.get("title") or r.get("remedy"),
             "predicted": r.get("predicted")} for r in report.get("recommendations") or []]
    return brief, recs


def compute_diff(a_state: SessionState, a_report: Mapping[str, Any], b_state: SessionState,
                 b_report: Mapping[str, Any], *, top: int = 10) -> dict[str, Any]:
    """The ``advisor.diff/1`` document comparing B against the baseline A."""
    a_metrics, b_metrics = metric_values(a_report), metric_values(b_report)
    a_phases, b_phases = _phases(a_report), _phases(b_report)
    a_cats = (a_report.get("memory") or {}).get("categories_at_peak") or {}
    b_cats = (b_report.get("memory") or {}).get("categories_at_peak") or {}
    a_ops, b_ops = _ops_per_step(a_state), _ops_per_step(b_state)
    ops = []
    for key in set(a_ops) | set(b_ops):
        ta = a_ops[key]["time_s"] if key in a_ops else None
        tb = b_ops[key]["time_s"] if key in b_ops else None
        ops.append({"name": key[0], "phase": key[1], "time_s": change(ta or 0.0, tb or 0.0),
                    "count": change(a_ops[key]["count"] if key in a_ops else 0.0,
                                    b_ops[key]["count"] if key in b_ops else 0.0),
                    "only_in": "a" if tb is None else "b" if ta is None else None})
    ops.sort(key=lambda r: (-abs(r["time_s"]["abs"]), r["name"], r["phase"]))
    a_coll, b_coll = _collectives_per_step(a_state), _collectives_per_step(b_state)
    collectives = []
    for op in sorted(set(a_coll) | set(b_coll)):
        ra, rb = a_coll.get(op), b_coll.get(op)
        collectives.append({"op": op, **{f: change(ra[f] if ra else 0.0, rb[f] if rb else 0.0)
                                         for f in ("count", "bytes", "time_s", "exposed_s")}})
    a_diag, a_recs = _advice(a_report)
    b_diag, b_recs = _advice(b_report)
    a_ids, b_ids = [r["id"] for r in a_recs], [r["id"] for r in b_recs]
    return {
        "schema": SCHEMA,
        "a": _session(a_state, a_report),
        "b": _session(b_state, b_report),
        "step_time": change(a_metrics["step_time"], b_metrics["step_time"]),
        # The step the phases split: they are means per steady step, so they add up to the mean
        # step, not to the median of ``step_time`` (a 681 ms median beside phases summing to 1.1 s).
        "mean_step_time": change((a_report.get("summary") or {}).get("mean_step_s"),
                                 (b_report.get("summary") or {}).get("mean_step_s")),
        "phases": {k: change(a_phases[k], b_phases[k]) for k in PHASES},
        "peak_memory": change(a_metrics["peak_memory"], b_metrics["peak_memory"]),
        "memory_categories": ({c: change(int(a_cats.get(c, 0)), int(b_cats.get(c, 0))) for c in MEMORY_CATEGORIES}
                              if a_cats or b_cats else {}),
        "ops": ops[:top],
        "collectives": collectives,
        "metrics": {m: change(a_metrics[m], b_metrics[m]) for m in METRICS},
        "diagnosis": {"a": a_diag, "b": b_diag,
                      "changed": (a_diag or {}).get("bottleneck") != (b_diag or {}).get("bottleneck")},
        "recommendations": {"a": a_recs, "b": b_recs, "added": [i for i in b_ids if i not in a_ids],
                            "removed": [i for i in a_ids if i not in b_ids]},
    }


# ------------------------------------------------------------------------------ the gate


@dataclass(frozen=True, kw_only=True)
class Threshold:
    """Fail when ``metric`` moves by more than ``limit`` in ``direction`` (+1 up, -1 down).

    ``relative``: ``limit`` is a fraction of A's value; otherwise it is in the metric's unit
    (seconds or bytes).
    """

    metric: str
    direction: int
    limit: float
    relative: bool
    text: str


_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_SPEC = re.compile(r"^\s*([a-z_]+)\s*:\s*([+-]?)\s*([0-9]*\.?[0-9]+)\s*([A-Za-z%]*)\s*$")


def parse_gate(spec: str) -> list[Threshold]:
    """``"step_time:+5%,peak_memory:+512MiB"`` -> thresholds; ``ValueError`` names what is valid."""
    valid = ", ".join(METRICS)
    out = []
    for item in spec.split(","):
        if not item.strip():
            continue
        match = _SPEC.match(item)
        if not match:
            raise ValueError(f"bad --fail-on item {item.strip()!r}: expected METRIC:+N% (or +N with a unit); "
                             f"metrics: {valid}")
        metric, sign, number, unit = match.groups()
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r} in --fail-on; valid metrics: {valid}")
        value = float(number)
        kind = METRICS[metric][0]
        if unit == "%":
            limit, relative = value / 100, True
        elif kind == "s" and unit in _TIME_UNITS:
            limit, relative = value * _TIME_UNITS[unit], False
        elif kind == "bytes" and unit:
            try:
                limit, relative = float(parse_size(f"{number}{unit}")), False
            except ValueError:
                raise ValueError(f"bad size {number}{unit} for {metric} in --fail-on (e.g. +512MiB); "
                                 f"metrics: {valid}") from None
        else:
            expected = "s, ms or us" if kind == "s" else "a size such as MiB or GB"
            raise ValueError(f"{item.strip()!r}: give a percentage or a unit ({expected}); metrics: {valid}")
        out.append(Threshold(metric=metric, direction=-1 if sign == "-" else 1, limit=limit,
                             relative=relative, text=f"{sign or '+'}{number}{unit}"))
    if not out:
        raise ValueError(f"empty --fail-on; expected e.g. step_time:+5%,peak_memory:+10%; metrics: {valid}")
    return out


def _fmt(value: float, unit: str) -> str:
    """One unit style everywhere (``advisor.records.units``): "107 ms", "6.94 s", "780 MiB"."""
    return fmt_bytes(value) if unit == "bytes" else fmt_seconds(value)


def check_gate(diff: Mapping[str, Any], thresholds: list[Threshold]) -> list[dict[str, Any]]:
    """One failure per crossed (or uncheckable) threshold, each with a one-line ``reason``."""
    failures = []
    for t in thresholds:
        c = diff["metrics"][t.metric]
        unit = METRICS[t.metric][0]
        if c["a"] is None or c["b"] is None:
            side = "A" if c["a"] is None else "B"
            failures.append({"metric": t.metric, "threshold": t.text, "change": c,
                             "reason": f"{t.metric}: cannot check {t.text}: not measured in session {side}"})
            continue
        moved = c["abs"] * t.direction
        if t.relative:
            if not c["a"]:
                crossed = moved > 0
            else:
                crossed = moved / abs(c["a"]) > t.limit
        else:
            crossed = moved > t.limit
        if crossed:
            rel = f"{c['rel']:+.1%}" if c["rel"] is not None else "from zero"
            failures.append({"metric": t.metric, "threshold": t.text, "change": c,
                             "reason": f"{t.metric} {rel} ({_fmt(c['a'], unit)} -> {_fmt(c['b'], unit)}) "
                                       f"crosses {t.text}"})
    return failures
