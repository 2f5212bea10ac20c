"""``advisor attach``: run the training job, follow it live (TUI or headless), report it."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from advisor.errors import EXIT_LAUNCH, AdvisorError
from advisor.session import AttachOptions, Session


def has_terminal() -> bool:
    """Whether a TUI can run: stdin and stdout are both a terminal."""
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def run_attach(ns: argparse.Namespace, config: dict[str, Any]) -> int:
    if not ns.headless and not has_terminal():
        # CI, nohup, `> out.txt`: a TUI would write escape codes into the file and wait for keys.
        print("advisor: no terminal (stdin or stdout is not a TTY): running headless", file=sys.stderr, flush=True)
        ns.headless = True
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
        finished: dict[str, Any] = {}
        if ns.headless:
            returncode = _follow_headless(session, ns)
        else:
            returncode = _follow_tui(session, advice, ns, finished)
        code, reason = finished["result"] if "result" in finished else session.finish(returncode)
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


def _watch_end(session: Session, finished: dict[str, Any]) -> None:
    """Finish the session as soon as training ends, so the TUI's exit banner shows it then."""
    returncode = session.wait()
    finished["result"] = session.finish(returncode)


def _follow_tui(session: Session, advice: Any, ns: argparse.Namespace, finished: dict[str, Any]) -> int:
    from advisor.live_source import SessionSource
    from advisor.tui.app import make_app

    source = SessionSource(session, advice)
    app = make_app(source, title=f"advisor · {ns.script}")
    watcher = threading.Thread(target=_watch_end, args=(session, finished), name="advisor-end", daemon=True)
    watcher.start()
    try:
        app.run()
    finally:
        source.stop()
    if session.poll() is None and "result" not in finished:
        # The UI is closed but training goes on: keep recording it, as headless does.
        print(f"advisor: UI closed; training continues and is recorded in {session.dir} "
              "(Ctrl-C stops the script)", file=sys.stderr, flush=True)
        returncode = _follow_headless(session, ns)
    else:
        returncode = session.wait()
    watcher.join(10)  # finish() waits for the last records (at most 5 s)
    return returncode


def _report(session: Session, ns: argparse.Namespace, code: int, reason: str) -> int:
    """The final report. Never on stdout, which belongs to the script: on stderr, or in
    ``--report FILE`` (``--format``) and ``--json FILE`` for scripts."""
    from advisor.render import emit_report, print_exit_summary
    from advisor.report import build_report, write_json

    state = session.live.snapshot()
    report = build_report(state, budget_bytes=ns.memory_budget)
    session.save_analysis(diagnosis=report.get("diagnosis"), recommendations=report.get("recommendations"))
    if ns.json:
        write_json(report, ns.json)
    fmt = getattr(ns, "format", "text")
    if getattr(ns, "report", None):
        with open(ns.report, "w") as handle:
            emit_report(report, fmt, handle)
        print(f"advisor: wrote report {ns.report}", file=sys.stderr, flush=True)
    elif ns.headless:
        emit_report(report, fmt, sys.stderr)
    else:
        print_exit_summary(report)
    print(f"advisor: {reason} (exit code {code}); session {session.id}", file=sys.stderr, flush=True)
    return code
