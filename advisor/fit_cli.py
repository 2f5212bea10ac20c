"""``advisor fit``: plan a job for a device it does not run on, from the unmodified script.

The controller starts one fitting process (``advisor.fit.bootstrap``: the agent, with the script
on fake tensors for the target; see ``advisor/fit/``) as ``advisor attach`` starts a training
process, records what its probes send into a session like any other, and then reports from that
session (``advisor.fit_report``): the predicted peak by category and module, the roofline step
time, whether it fits, and when it does not, the best plan, written as a plan file. The script's
own output goes to the session's ``output.log``: its values are placeholders.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from advisor.fit_report import build_fit_report, render_fit_report, write_fit_plan
from advisor.records.fit import FIT_STEPS, FitSettings
from advisor.records.settings import AgentSettings
from advisor.report import write_json
from advisor.controller import AttachOptions, Session

FIT_BOOTSTRAP = "advisor.fit.bootstrap"
EXIT_UNRUNNABLE = 1  # the script could not be run on fake tensors (a read before its first step, ...)


def fit_settings(ns: argparse.Namespace) -> tuple[FitSettings, AgentSettings]:
    fit = FitSettings(target=ns.target, nproc_per_node=ns.nproc_per_node, nnodes=ns.nnodes)
    device = fit.device
    settings = AgentSettings(
        memory_budget_bytes=ns.memory_budget, fit=fit,
        host_link_bandwidth=device.host_link_bandwidth if device is not None else None,
        # A fit's steps are all deep enough: 1 tracked (memory, collectives), 2 counted (FLOPs).
        light_timing_every=0)
    return fit, settings


def run_fit(ns: argparse.Namespace) -> int:
    fit, settings = fit_settings(ns)
    options = AttachOptions(script=ns.script, args=list(ns.args), nproc_per_node=1, max_steps=FIT_STEPS,
                            capture_output=True, settings=settings, bootstrap=FIT_BOOTSTRAP,
                            env=fit.environment())
    session = Session(options)
    session.launch("fitting process")
    try:
        print(f"advisor: fitting {ns.script} for {_job(fit)} on fake tensors; session {session.id}",
              file=sys.stderr, flush=True)
        returncode = session.wait()
        code, reason = session.finish(returncode)
        state = session.live.snapshot()
        report = build_fit_report(state, fit=fit, budget_bytes=ns.memory_budget)
        unrunnable = report.get("unrunnable")
        if unrunnable is None and code == 0:
            plan_path = ns.output or str(session.dir / "plan.json")
            written = write_fit_plan(report, plan_path)
            if written:
                report["plan"]["file"] = written
        session.store.set_meta(fit=_summary(report))
        if ns.json:
            write_json(report, ns.json)
        print(render_fit_report(report), flush=True)
        if unrunnable is not None:
            print(f"advisor: error: {unrunnable['message']}", file=sys.stderr)
            print(f"hint: {unrunnable['hint']}", file=sys.stderr)
            return EXIT_UNRUNNABLE
        if code != 0:
            print(f"advisor: the script {reason} under the fit (exit code {code}); its output is in "
                  f"{session.output_path}", file=sys.stderr)
            return code
        return 0
    finally:
        session.close()


def _job(fit: FitSettings) -> str:
    device = fit.device.key if fit.device is not None else "the CPU"
    if fit.world_size == 1:
        return device
    nodes = f" x {fit.nnodes} nodes" if fit.nnodes > 1 else ""
    return f"{fit.nproc_per_node} x {device}{nodes}"


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    """The fit's verdict in the session's metadata (``advisor sessions`` and a later report)."""
    verdict = report.get("verdict") or {}
    return {"target": report["target"]["key"], "world_size": report["world"]["world_size"],
            "fits": verdict.get("fits"), "predicted_bytes": verdict.get("predicted_bytes")}
