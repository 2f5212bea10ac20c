"""``advisor attach``: run the training job, follow it live (TUI or headless), report it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from advisor.errors import EXIT_LAUNCH, AdvisorError
from advisor.session import AttachOptions, Session


def run_attach(ns: argparse.Namespace, config: dict[str, Any]) -> int:
    options = AttachOptions(script=ns.script, args=list(ns.args), nproc_per_node=ns.nproc_per_node,
                            max_steps=ns.steps, capture_output=not ns.headless, agent_config=config)
    session = Session(options)
    from advisor.advice import AdviceLoop

    advice = AdviceLoop(session, budget_bytes=config.get("memory_budget_bytes"),
                        apply=ns.apply, apply_at_step=ns.apply_at_step)
    session.add_listener(advice.on_record)
    try:
        session.start()
    except OSError as exc:
        session.close()
        raise AdvisorError(f"could not start the training process: {exc}", exit_code=EXIT_LAUNCH) from None
    try:
        if ns.headless:
            returncode = _follow_headless(session, ns)
        else:
            returncode = _follow_tui(session, advice, ns)
        code, reason = session.finish(returncode)
        advice.finish()
        return _report(session, ns, code, reason)
    finally:
        advice.close()
        session.close()


def _follow_headless(session: Session, ns: argparse.Namespace) -> int:
    from advisor.progress import ProgressPrinter

    printer = ProgressPrinter(total=ns.steps)
    session.add_listener(printer)
    print(f"advisor: session {session.id} ({session.dir})", file=sys.stderr, flush=True)
    try:
        return session.wait()
    finally:
        printer.close()


def _follow_tui(session: Session, advice: Any, ns: argparse.Namespace) -> int:
    from advisor.live_source import SessionSource
    from advisor.tui.app import make_app

    source = SessionSource(session, advice)
    app = make_app(source, title=f"advisor · {ns.script}")
    try:
        app.run()
    finally:
        source.stop()
    if session.poll() is None:
        # The UI is closed but training goes on: keep recording it, as headless does.
        print(f"advisor: UI closed; training continues and is recorded in {session.dir} "
              "(Ctrl-C stops the script)", file=sys.stderr, flush=True)
        return _follow_headless(session, ns)
    return session.wait()


def _report(session: Session, ns: argparse.Namespace, code: int, reason: str) -> int:
    from advisor.report import build_report, write_json

    state = session.live.snapshot()
    report = build_report(state, budget_bytes=ns.memory_budget)
    session.save_analysis(diagnosis=report.get("diagnosis"), recommendations=report.get("recommendations"))
    if ns.json:
        try:
            write_json(report, ns.json)
        except OSError as exc:  # checked before the job started, but folders can vanish meanwhile
            fallback = session.dir / "report.json"
            write_json(report, str(fallback))
            print(f"advisor: could not write {ns.json} ({exc.strerror or exc}); the report is in {fallback}",
                  file=sys.stderr, flush=True)
    if ns.headless:
        from advisor.render import print_report

        print_report(report)
    else:
        from advisor.render import print_exit_summary

        print_exit_summary(report)
    print(f"advisor: {reason} (exit code {code}); session {session.id}", file=sys.stderr, flush=True)
    if ns.apply and ns.headless and not _applied(state, ns.apply):
        ids = ", ".join(str(r.get("id")) for r in state.recommendations) or "none"
        print(f"advisor: the requested --apply {ns.apply} never happened (recommendations in this run: {ids})",
              file=sys.stderr, flush=True)
        return code or 1
    return code


def _applied(state: Any, request: str) -> bool:
    """Whether the remedy asked for with --apply was applied (kept, reverted or failed: it ran)."""
    return any(request == "auto" or a.get("recommendation_id") == request for a in state.applied)
