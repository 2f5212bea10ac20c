"""The headless report: a versioned JSON document built from a ``SessionState``.

The field names are a public contract, documented in docs/report-schema.md:
add fields, never rename them.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

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
                        "optimizer_s": dict(s.optimizer_s)})
    return out


def summary_section(state: SessionState) -> dict[str, Any]:
    """Steady-state figures: step 0 (warm-up) and deep-sampled steps are left out where possible."""
    samples = state.rank0_steps()
    steady = [s for s in samples if s.index > 0 and not s.deep] or [s for s in samples if s.index > 0] or samples
    if not steady:
        return {"steps": 0}
    times = [s.time_s for s in steady]
    total = sum(times) or 1e-12
    phases = {k: sum(s.phases.get(k, 0.0) for s in steady) / total
              for k in ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s")}
    return {"steps": len(samples), "median_step_s": statistics.median(times),
            "mean_step_s": total / len(times), "phase_share": phases,
            "last_loss": samples[-1].loss}


def recorded_budget(state: SessionState) -> int | None:
    """The --memory-budget the session was recorded with, if any."""
    for run in state.runs.values():
        if run.config.get("memory_budget_bytes"):
            return int(run.config["memory_budget_bytes"])
    return None


def build_report(state: SessionState, *, budget_bytes: int | None = None) -> dict[str, Any]:
    """The report; ``budget_bytes`` overrides the budget the session was recorded with."""
    from advisor.sections import build_sections

    budget_bytes = budget_bytes or recorded_budget(state)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "session": {"id": state.session_id, "path": state.session_path},
        "run": run_section(state),
        "steps": steps_section(state),
        "summary": summary_section(state),
        "warnings": [e.data.get("message", "") for e in state.events if e.name == "warning"],
    }
    report.update(build_sections(state, report, budget_bytes=budget_bytes))
    return report


def write_json(report: dict[str, Any], path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(report, handle, indent=1, allow_nan=False, default=str)
    os.replace(tmp, path)
