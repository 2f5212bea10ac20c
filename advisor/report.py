"""The headless report: a versioned JSON document built from a ``SessionState``.

The field names are a public contract, documented in docs/report-schema.md:
add fields, never rename them.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from typing import Any

from advisor.advice import session_budget
from advisor.job import job_section
from advisor.records.events import warnings_of
from advisor.records.samples import ordinary_steps
from advisor.sections import build_sections
from advisor.state import SessionState

SCHEMA = "advisor.report/1"


def run_section(state: SessionState) -> dict[str, Any]:
    first = state.runs.get(0) or (state.runs[min(state.runs)] if state.runs else None)
    device = dict(first.device) if first else {}
    return {
        "script": first.script if first else None,
        "argv": list(first.argv) if first else [],
        "world_size": state.world_size,
        "device": {"type": device.get("type"), "name": device.get("name"),
                   **{k: v for k, v in device.items() if k not in ("type", "name")}},
        "torch_version": first.torch_version if first else None,
        "python_version": first.python_version if first else None,
        "ranks": sorted(state.runs),
        "restarts": max((r.restart_count for r in state.runs.values()), default=0),
        "exit": {"code": state.exit_code, "reason": state.exit_reason,
                 "ranks": [e.to_dict() for _, e in sorted(state.exits.items())]},
        "models": [m.to_dict() | {"modules": len(m.modules)} for m in state.models],
        "optimizers": [o.to_dict() for o in state.optimizers],
    }


def steps_section(state: SessionState) -> list[dict[str, Any]]:
    out = []
    for rank in sorted(state.steps):
        for s in state.steps[rank]:
            out.append({"index": s.index, "rank": s.rank, "time_s": s.time_s, "loss": s.loss,
                        "phases": dict(s.phases), "micro_batches": s.micro_batches,
                        "peak_memory_bytes": s.peak_memory_bytes, "deep": s.deep, "end_time": s.end_time,
                        "losses": s.losses, "eval_s": s.eval_s, "boundary": s.boundary,
                        "optimizer_s": dict(s.optimizer_s), "module_forward_s": dict(s.module_forward_s),
                        "device_time_s": s.device_time_s, "deep_probes": list(s.deep_probes)})
    return out


def summary_section(state: SessionState) -> dict[str, Any]:
    """Steady-state figures over every step: step 0 (warm-up) and deep-sampled steps are left out
    where possible. ``steps_total`` counts every step of every rank, ``steps_listed`` those in the
    report's step list, ``steps_dropped`` the difference (the list keeps the last
    ``MAX_LIVE_STEPS`` per rank; the session store keeps them all)."""
    samples = state.rank0_steps()
    listed = sum(len(s) for s in state.steps.values())
    totals = state.step_totals.get(0) or (state.step_totals[min(state.step_totals)] if state.step_totals else None)
    if totals is not None:
        out = totals.summary()
        total = sum(t.count for t in state.step_totals.values())
    else:  # a state built without totals (tests, older callers): the list is all there is
        steady = ordinary_steps(samples)
        out = {"steps": 0}
        if steady:
            times = [s.time_s for s in steady]
            span = sum(times) or 1e-12
            phases = {k: sum(s.phases.get(k, 0.0) for s in steady) / span
                      for k in ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s")}
            out = {"steps": len(samples), "median_step_s": statistics.median(times),
                   "mean_step_s": span / len(times), "phase_share": phases, "last_loss": samples[-1].loss}
        total = listed
    share = out.get("phase_share")
    if isinstance(share, dict):
        # ``phase_share``'s keys end in ``_s`` but hold fractions; the field stays (a public
        # contract, deprecated) beside two correctly named ones: the fractions, and the mean
        # seconds per steady step they give, which add up to ``mean_step_s``.
        out["phase_fraction"] = {key[:-2]: value for key, value in share.items()}
        mean = out.get("mean_step_s")
        out["phase_mean_s"] = {key: value * mean for key, value in share.items()} if mean is not None else None
    out.update(steps_total=total, steps_listed=listed, steps_dropped=max(0, total - listed))
    if state.records_dropped:  # a long run's oldest non-step records, let go in memory (the store has them)
        out["records_dropped"] = dict(state.records_dropped)
    return out


def build_report(state: SessionState, *, budget_bytes: int | None = None,
                 advice: tuple[Any, list[Any]] | None = None) -> dict[str, Any]:
    """The report; ``budget_bytes`` overrides the budget the session was recorded with, which
    defaults to the device's memory (``run.device.memory_capacity``) when that is known.
    ``advice``: ``advise_state(state, budget_bytes=budget_bytes)``'s answer when the caller has it
    already (attach's report: the recommender over every record of a large model takes 0.3 s)."""
    budget_bytes = session_budget(state, budget_bytes)  # by default the device's memory
    run = run_section(state)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "session": {"id": state.session_id, "path": state.session_path},
        "job": job_section(state),
        "run": run,
        "steps": steps_section(state),
        "summary": summary_section(state),
        "warnings": warnings_of(state.events),
    }
    report.update(build_sections(state, report, budget_bytes=budget_bytes, advice=advice))
    return report


INDENTED_MAX = 1 << 20  # a report up to this long (compact) is written indented, for a reader's eyes


def write_json(report: dict[str, Any], path: str) -> None:
    """The report as JSON, written atomically (``write_text``): indented, or on one line when it
    is longer than ``INDENTED_MAX`` (a model of 5001 modules: 11 MB, whose indenting, done by
    Python's pure-Python encoder, took 0.5 s against 0.18 s)."""
    write_text(json_text(report), path)


def json_text(report: dict[str, Any]) -> str:
    """The report as ``write_json`` writes it."""
    text = json.dumps(report, allow_nan=False, default=str)
    if len(text) <= INDENTED_MAX:
        text = json.dumps(report, indent=1, allow_nan=False, default=str)
    return text


def write_text(text: str, path: str) -> None:
    """Write atomically: a fresh temporary file in the target's folder (``mkstemp``: never a
    name someone else could have planted, such as a symlink at ``path.tmp``), then rename."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
