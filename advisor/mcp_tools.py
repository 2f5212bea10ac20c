"""The advisor's MCP tools (``advisor mcp``, advisor/mcp_server.py): sessions, report sections,
advice at a budget, a finding's evidence, plans; and, only with ``--allow-apply``, apply and revert
on a live session.

Everything read goes through the paths ``advisor report`` and ``advisor plan`` use
(``advisor.job.load_job``, ``advisor.report.build_report``, ``advisor.planning``), so an agent
sees exactly what the terminal shows. Apply and revert reach the session's running controller
over its control path (advisor/records/control.py: owner-only, authenticated; the controller's
``AdviceLoop`` refuses what the TUI refuses), and a remedy that changes numerics (apply class
``live-opt-in``) needs ``confirm: true``, the user's explicit consent, as the TUI's dialog does.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from advisor import __version__
from advisor.errors import AdvisorError
from advisor.job import load_job, split_refs
from advisor.listing import session_rows
from advisor.mcp_server import McpServer, Tool, ToolError
from advisor.paths import DB_NAME, resolve_session
from advisor.planning import write_plan_from_session
from advisor.records.control import CONTROL_FILE, ControlClient, ControlError
from advisor.records.units import parse_size
from advisor.report import build_report
from advisor.store import read_meta

SESSION = {"type": "string", "description": "a session id (or a unique part of one), a session folder, "
                                            "its .sqlite file, or 'latest' (default)"}
BUDGET = {"type": ["string", "integer"], "description": "memory budget to advise against: bytes, or a size "
                                                      "such as '12GiB' (default: the session's own)"}
LIST_LIMIT = 200  # items of a list section returned by default (its length is always said)
INSTRUCTIONS = (
    "The advisor profiles PyTorch training runs (sessions recorded by `advisor attach`, "
    "`advisor.session()` or a trainer callback), diagnoses the bottleneck and recommends remedies with "
    "predicted peak memory and step time. Start with list_sessions, then get_advice (optionally at a "
    "memory budget), get_evidence for why, read_report_section for figures, write_plan for a remedy "
    "that needs a restart. apply_recommendation and revert_remedy exist only when the server was "
    "started with --allow-apply; they change a running job: ask the user first, and pass confirm=true "
    "for a live-opt-in remedy (it changes the training's numerics) only after the user agreed.")


def _budget(arguments: dict[str, Any]) -> int | None:
    value = arguments.get("memory_budget")
    if value is None:
        return None
    try:
        budget = value if isinstance(value, int) else parse_size(str(value))
    except ValueError as exc:
        raise ToolError(str(exc), hint="a size such as 12GiB, 800MiB or a number of bytes") from None
    if budget <= 0:
        raise ToolError(f"a memory budget must be more than 0 bytes, got {value!r}")
    return budget


def _report(arguments: dict[str, Any]) -> dict[str, Any]:
    ref = arguments.get("session") or "latest"
    try:
        return build_report(load_job(split_refs(ref)), budget_bytes=_budget(arguments))
    except AdvisorError as exc:
        raise ToolError(str(exc), hint=exc.hint) from None


def _session_folder(arguments: dict[str, Any]) -> Path:
    try:
        return resolve_session(arguments.get("session") or "latest").parent
    except AdvisorError as exc:
        raise ToolError(str(exc), hint=exc.hint) from None


def list_sessions(arguments: dict[str, Any]) -> dict[str, Any]:
    rows = list(reversed(session_rows()))  # newest first
    limit = arguments.get("limit", 20)
    return {"count": len(rows), "sessions": [
        {"id": row.id, "script": row.script, "status": row.status, "finished": row.finished,
         "exit_code": row.exit_code, "live": (row.path.parent / CONTROL_FILE).exists(),
         "created": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(row.created)) if row.created else None}
        for row in rows[:max(0, limit)]]}


def read_report_section(arguments: dict[str, Any]) -> dict[str, Any]:
    report = _report(arguments)
    section = arguments["section"]
    if section not in report:
        raise ToolError(f"no section {section!r}", hint=f"sections: {', '.join(report)}")
    value = report[section]
    out: dict[str, Any] = {"session": report["session"]["id"], "section": section}
    limit = arguments.get("limit", LIST_LIMIT)
    if isinstance(value, list) and len(value) > limit:
        out["note"] = f"the last {limit} of {len(value)} items (pass limit for more)"
        value = value[-limit:] if limit > 0 else []
    out["value"] = value
    return out


def _summary(rec: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "title", "remedy", "apply_class", "live", "exact", "fits", "applicable", "why", "confidence",
            "predicted", "baseline",
            "calibration")
    return {key: rec.get(key) for key in keys}


def get_advice(arguments: dict[str, Any]) -> dict[str, Any]:
    report = _report(arguments)
    return {"session": report["session"]["id"], "budget_bytes": (report.get("memory") or {}).get("budget_bytes"),
            "diagnosis": report.get("diagnosis"),
            "recommendations": [_summary(rec) for rec in report.get("recommendations") or []],
            "applied": report.get("applied") or []}


def get_evidence(arguments: dict[str, Any]) -> dict[str, Any]:
    report = _report(arguments)
    finding = arguments["finding"]
    if finding == "diagnosis":
        diagnosis = report.get("diagnosis")
        if diagnosis is None:
            raise ToolError("no diagnosis: nothing was measured deeply in this session")
        return {"session": report["session"]["id"], "finding": "diagnosis", **diagnosis}
    recs = report.get("recommendations") or []
    rec = next((r for r in recs if r.get("id") == finding), None)
    if rec is None:
        raise ToolError(f"no recommendation {finding!r} at this budget",
                        hint=f"'diagnosis', or one of: {', '.join(str(r.get('id')) for r in recs) or 'none'}")
    keys = ("evidence", "prerequisites", "cost_model", "params", "block_plan", "parts", "curve", "calibration")
    return {"session": report["session"]["id"], "finding": finding, **_summary(rec),
            **{key: rec.get(key) for key in keys}}


def write_plan(arguments: dict[str, Any]) -> dict[str, Any]:
    db_path = _session_folder(arguments) / DB_NAME
    output = Path(arguments["output"]).expanduser()
    if output.is_dir() or not output.parent.is_dir():
        raise ToolError(f"cannot write a plan to {output}", hint="name a file in an existing folder, e.g. plan.json")
    script = read_meta(db_path).get("script")
    if isinstance(script, str) and output.resolve() == Path(script).resolve():
        raise ToolError(f"{output} is the session's training script", hint="name another file for the plan")
    before = output.stat().st_mtime_ns if output.exists() else None
    try:
        write_plan_from_session(db_path, str(output), budget_bytes=_budget(arguments),
                                recommendation_id=arguments.get("recommendation"))
    except AdvisorError as exc:
        raise ToolError(str(exc), hint=exc.hint) from None
    written = output.exists() and output.stat().st_mtime_ns != before
    return {"plan": str(output.resolve()) if written else None, "written": written,
            "run_with": f"advisor attach --plan {output} SCRIPT" if written else None}


def _control(arguments: dict[str, Any], op: str, **args: Any) -> dict[str, Any]:
    folder = _session_folder(arguments)
    try:
        with ControlClient(folder) as client:
            return {"session": folder.name, **client.request(op, **args)}
    except ControlError as exc:
        raise ToolError(str(exc)) from None


def apply_recommendation(arguments: dict[str, Any]) -> dict[str, Any]:
    sent = _control(arguments, "apply", recommendation_id=arguments["recommendation_id"],
                    confirm=bool(arguments.get("confirm", False)))
    return {**sent, "note": "sent: the job applies it at the step boundary named, measures it and keeps or "
                            "reverts it; get_advice's applied list shows the result"}


def revert_remedy(arguments: dict[str, Any]) -> dict[str, Any]:
    sent = _control(arguments, "revert", recommendation_id=arguments.get("recommendation_id"))
    return {**sent, "note": "sent: the job reverts it at the next step boundary"}


def build_tools(*, allow_apply: bool) -> list[Tool]:
    tools = [
        Tool(name="list_sessions", title="List recorded sessions",
             description="The advisor's recorded training sessions, newest first: id, script, status (running, "
                         "or how it ended), and whether it is live (a controller is running it).",
             properties={"limit": {"type": "integer", "description": "at most this many (default 20)"}},
             run=list_sessions),
        Tool(name="read_report_section", title="Read a report section",
             description="One section of a session's report (schema advisor.report/1): run, steps, summary, "
                         "memory, ops, compute, collectives, comm, diagnosis, recommendations, applied, regimes, "
                         "calibration, warnings, ...; the same figures `advisor report` prints.",
             properties={"session": SESSION, "section": {"type": "string", "description": "the section's key"},
                         "memory_budget": BUDGET,
                         "limit": {"type": "integer", "description": f"items of a list section (default {LIST_LIMIT}, "
                                                                     "the last ones)"}},
             required=("section",), run=read_report_section),
        Tool(name="get_advice", title="Diagnosis and recommendations",
             description="The session's diagnosis (its bottleneck, with evidence) and its ranked recommendations at "
                         "a memory budget: each with its apply class (live-exact, live-equivalent, live-opt-in, "
                         "restart), predicted and baseline peak memory and step time, and whether it fits; and the "
                         "applies so far with their predicted and measured figures.",
             properties={"session": SESSION, "memory_budget": BUDGET}, run=get_advice),
        Tool(name="get_evidence", title="Evidence for a finding",
             description="Why the advisor says what it says: the diagnosis's evidence, or a recommendation's "
                         "evidence, prerequisites, cost model, parameters, block plan and budget curve.",
             properties={"session": SESSION, "memory_budget": BUDGET,
                         "finding": {"type": "string", "description": "'diagnosis' or a recommendation id"}},
             required=("finding",), run=get_evidence),
        Tool(name="write_plan", title="Write a plan file",
             description="Write a recommendation (default: the top applicable one) to a plan file that "
                         "`advisor attach --plan FILE SCRIPT` applies before the first step of the next run. "
                         "Writes that one file and nothing else.",
             properties={"session": SESSION, "memory_budget": BUDGET,
                         "output": {"type": "string", "description": "the plan file to write, e.g. plan.json"},
                         "recommendation": {"type": "string", "description": "a recommendation id (default: the top one)"}},
             required=("output",), run=write_plan, read_only=False),
    ]
    if allow_apply:
        tools += [
            Tool(name="apply_recommendation", title="Apply a remedy to a running job",
                 description="Apply a live recommendation to the session's running job at its next step boundary; "
                             "the job measures it and keeps or reverts it. Refused when the session is not live, "
                             "another change is in flight, or the remedy needs a restart. A live-opt-in remedy "
                             "changes the training's numerics: pass confirm=true only after the user explicitly "
                             "agreed to that.",
                 properties={"session": SESSION,
                             "recommendation_id": {"type": "string", "description": "from get_advice"},
                             "confirm": {"type": "boolean", "description": "the user's consent to a change of "
                                                                           "numerics (live-opt-in only)"}},
                 required=("recommendation_id",), run=apply_recommendation, read_only=False),
            Tool(name="revert_remedy", title="Revert the remedy in force",
                 description="Revert the remedy last kept on the session's running job, at its next step boundary.",
                 properties={"session": SESSION,
                             "recommendation_id": {"type": "string", "description": "the remedy in force (checked)"}},
                 run=revert_remedy, read_only=False, destructive=True),
        ]
    return tools


def build_server(*, allow_apply: bool) -> McpServer:
    return McpServer(build_tools(allow_apply=allow_apply), name="advisor", version=__version__,
                     title="advisor: PyTorch training profiler and advisor", instructions=INSTRUCTIONS)
