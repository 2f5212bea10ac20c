"""``advisor attach``: run the training job, follow it live (TUI or headless), report it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from advisor import tui  # its package defers textual until make_app is used (headless never loads it)
from advisor.advice import AdviceLoop
from advisor.errors import EXIT_LAUNCH, AdvisorError
from advisor.live_source import SessionSource
from advisor.progress import ProgressPrinter
from advisor.render import print_exit_summary, print_report
from advisor.report import build_report, write_json
from advisor.session import AttachOptions, Session


def run_attach(ns: argparse.Namespace, config: dict[str, Any]) -> int:
    options = AttachOptions(script=ns.script, args=list(ns.args), nproc_per_node=ns.nproc_per_node,
                            max_steps=ns.steps, capture_output=not ns.headless, agent_config=config)
    session = Session(options)
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
    printer = ProgressPrinter(total=ns.steps)
    session.add_listener(printer)
    print(f"advisor: session {session.id} ({session.dir})", file=sys.stderr, flush=True)
    try:
        return session.wait()
    finally:
        printer.close()


def _follow_tui(session: Session, advice: Any, ns: argparse.Namespace) -> int:
    source = SessionSource(session, advice)
    app = tui.make_app(source, title=f"advisor · {ns.script}")
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
    state = session.live.snapshot()
    report = build_report(state, budget_bytes=ns.memory_budget)
    session.save_analysis(diagnosis=report.get("diagnosis"), recommendations=report.get("recommendations"))
    if ns.json:
        write_json(report, ns.json)
    if ns.headless:
        print_report(report)
    else:
        print_exit_summary(report)
    print(f"advisor: {reason} (exit code {code}); session {session.id}", file=sys.stderr, flush=True)
    return code
