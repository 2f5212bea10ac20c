"""``advisor attach``: run the training job, follow it live (TUI or headless), report it."""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import threading
from typing import Any, Callable

from advisor import tui  # its package defers textual until make_app is used (headless never loads it)
from advisor.advice import AdviceLoop
from advisor.control_server import ControlOps, ControlServer
from advisor.live_source import SessionSource
from advisor.progress import ProgressPrinter
from advisor.records.settings import AgentSettings
from advisor.render import emit_report, print_exit_summary
from advisor.report import json_text, write_text
from advisor.exits import signal_name
from advisor.records.units import plain_text
from advisor.controller import AttachOptions, Session, allowed_plan_env
from advisor.early_report import EarlyReport
from advisor.early_report import make as make_report
from advisor.trackers import log_report
from advisor.tui.results import RESULT_LEFT_RUNNING, RESULT_STOP_TRAINING

CONTROLLER_LOG = "controller.log"  # where the controller writes once its terminal is gone (SIGHUP)

STOP_GRACE_S = 30.0  # after a SIGTERM/SIGHUP to the controller, how long the script may take to stop


class StopOnSignal:
    """SIGTERM or SIGHUP to the controller (a supervisor, ``kill``, a closed terminal): stop the
    training job deliberately, not orphan it. The job gets SIGTERM (torchrun passes it to every
    rank; each agent records its exit), the TUI is closed so the terminal is restored, and the
    report is written as for any other end. A second signal kills the job at once.

    Under the TUI a closed terminal (SIGHUP, with ``on_hangup`` set) is not a request to stop:
    the UI closes, the controller writes to ``controller.log`` in the session folder from then
    on, and the job trains on, recorded (it runs in its own session, so the terminal's own
    SIGHUP never reaches it either; advisor/controller.py)."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, session: Session) -> None:
        self.session = session
        self.received: int | None = None
        self.chosen = False  # the user chose "stop the training" on quitting the TUI
        self.on_stop: Callable[[], None] | None = None  # the TUI's exit, while it runs
        self.on_hangup: Callable[[], None] | None = None  # the TUI's "leave it running" exit, while it runs
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP and self.on_hangup is not None:
            hangup, self.on_hangup = self.on_hangup, None
            _detach_output(self.session.dir / CONTROLLER_LOG)
            # To the descriptor: while the UI runs, Textual holds sys.stderr.
            _write_fd(2, f"advisor: the terminal closed: the UI is gone, training continues and is "
                         f"recorded in {self.session.dir}\n")
            threading.Thread(target=hangup, daemon=True).start()  # never touch the UI from a handler
            return
        process = self.session.process
        if self.received is not None:
            if process is not None and process.poll() is None:
                self.session.kill()
            return
        self.received = signum
        _say(f"advisor: received {signal_name(signum)}: stopping the training job (SIGTERM, then SIGKILL "
             f"after {STOP_GRACE_S:.0f} s) and writing its report; send it again to kill the job at once")
        self.stop_job()
        if self.on_stop is not None:
            threading.Thread(target=self.on_stop, daemon=True).start()  # never touch the UI from a handler

    def stop_job(self) -> None:
        """SIGTERM to the job now, SIGKILL after ``STOP_GRACE_S`` if it is still running."""
        process = self.session.process
        if process is not None and process.poll() is None:
            self.session.mark_stopped()  # a rank failing from here on failed because of the stop
            # torchrun passes it on to every rank; each agent records its exit.
            _signal_job(process, signal.SIGTERM)
            timer = threading.Timer(STOP_GRACE_S, lambda: process.poll() is None and self.session.kill())
            timer.daemon = True
            timer.start()

    def note(self) -> str:
        if self.chosen:
            return "; the user stopped the job from the TUI (q, then s)"
        return f"; the advisor received {signal_name(self.received)} and stopped the job" if self.received else ""


def _signal_job(process: Any, signum: int) -> None:
    try:
        process.send_signal(signum)
    except ProcessLookupError:
        pass


def _write_fd(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode())
    except OSError:
        pass


def _detach_output(log: Any) -> None:
    """Point stdout and stderr at ``log``: writes to a hung-up terminal fail (EIO), and the
    controller must keep recording the job without one."""
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    for target in (1, 2):
        try:
            os.dup2(fd, target)
        except OSError:
            pass
    os.close(fd)


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # SIGHUP: the terminal may be gone


def has_terminal() -> bool:
    """Whether a TUI can run: stdin and stdout are both a terminal."""
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def run_attach(ns: argparse.Namespace, settings: AgentSettings) -> int:
    if not ns.headless and not has_terminal():
        # CI, nohup, `> out.txt`: a TUI would write escape codes into the file and wait for keys.
        print("advisor: no terminal (stdin or stdout is not a TTY): running headless", file=sys.stderr, flush=True)
        ns.headless = True
    for name, value in allowed_plan_env(settings.plan_env).items():  # said before the job starts: a plan is a shared file
        print(f"advisor: the plan sets {name}={value} in the training process's environment", file=sys.stderr,
              flush=True)
    options = AttachOptions(script=ns.script, args=list(ns.args), nproc_per_node=ns.nproc_per_node,
                            max_steps=ns.steps, capture_output=not ns.headless, settings=settings)
    if getattr(ns, "multinode", None) is not None:
        options.multinode = ns.multinode
    session = Session(options)
    advice = AdviceLoop(session, budget_bytes=settings.memory_budget_bytes,
                        apply=ns.apply, apply_at_step=ns.apply_at_step)
    session.add_listener(advice.on_record)
    early = EarlyReport(session, ns.memory_budget, with_json=bool(ns.json))
    session.launch()
    control: ControlServer | None = None
    try:
        # Local clients holding the session's control secret (`advisor mcp --allow-apply`) reach the
        # advice loop as the TUI does (advisor/control_server.py).
        control = ControlServer(session.dir, ControlOps(session, advice, budget_bytes=ns.memory_budget))
        finished: dict[str, Any] = {}
        with StopOnSignal(session) as stop:
            if ns.headless:
                returncode = _follow_headless(session, ns)
            else:
                returncode = _follow_tui(session, advice, ns, stop, finished)
            code, reason = finished["result"] if "result" in finished else session.finish(returncode, note=stop.note())
        control.close()  # the job has ended: nothing to apply to any more
        return _report(session, ns, code, reason, early)  # advised there, once, on every record
    finally:
        if control is not None:
            control.close()
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


def _watch_end(session: Session, stop: StopOnSignal, finished: dict[str, Any]) -> None:
    """Finish the session as soon as training ends, so the TUI's exit banner shows it then."""
    returncode = session.wait()
    finished["result"] = session.finish(returncode, note=stop.note())


def _follow_tui(session: Session, advice: Any, ns: argparse.Namespace, stop: StopOnSignal,
                finished: dict[str, Any]) -> int:
    source = SessionSource(session, advice)
    app = tui.make_app(source, title="advisor")  # the subtitle names the script, the step and the session
    stop.on_stop = lambda: app.call_from_thread(app.exit)
    stop.on_hangup = lambda: app.call_from_thread(app.exit, RESULT_LEFT_RUNNING)
    watcher = threading.Thread(target=_watch_end, args=(session, stop, finished), name="advisor-end", daemon=True)
    watcher.start()
    try:
        result = app.run()  # Textual restores the terminal when run() returns
    finally:
        stop.on_stop = stop.on_hangup = None
        source.stop()
    _show_output(session)
    if stop.received is not None:
        returncode = session.wait()
    elif result == RESULT_STOP_TRAINING and session.poll() is None:
        # The user chose "stop the training" on q: as a SIGTERM to the controller would.
        stop.chosen = True
        print(f"advisor: stopping the training job (SIGTERM, then SIGKILL after {STOP_GRACE_S:.0f} s) and "
              "writing its report", file=sys.stderr, flush=True)
        stop.stop_job()
        returncode = session.wait()
    elif session.poll() is None and "result" not in finished:
        # The UI is closed but training goes on: keep recording it, as headless does.
        print(f"advisor: UI closed; training continues and is recorded in {session.dir} "
              f"(Ctrl-C stops the script); its output goes on to {session.output_path}", file=sys.stderr, flush=True)
        returncode = _follow_headless(session, ns)
    else:
        returncode = session.wait()
    watcher.join(10)  # finish() waits for the last records (at most 5 s)
    return returncode


OUTPUT_SHOWN = 5  # the script's last lines printed when the UI closes


def _show_output(session: Session) -> None:
    """The UI is gone and with it the Output view: the script's last lines (the report, at the end,
    says where all of it is)."""
    tail = session.live.snapshot().output_tail[-OUTPUT_SHOWN:]
    if tail:
        print(f"advisor: the script's last output ({len(tail)} line{'s' if len(tail) != 1 else ''}):",
              file=sys.stderr, flush=True)
        for line in tail:
            print(f"  {line}", file=sys.stderr, flush=True)


def _report(session: Session, ns: argparse.Namespace, code: int, reason: str, early: EarlyReport) -> int:
    """The final report. Never on stdout, which belongs to the script: on stderr, or in
    ``--report FILE`` (``--format``) and ``--json FILE`` for scripts. Made while the training
    process tore down when nothing has changed since (``advisor/early_report.py``)."""
    made = early.take(code, reason) or make_report(session.live.snapshot(), ns.memory_budget, with_json=bool(ns.json))
    state, report = made.state, made.report
    session.save_analysis(diagnosis=report.get("diagnosis"), recommendations=report.get("recommendations"))
    log_report(report, getattr(ns, "log_to", None) or [])
    if ns.json:
        text = made.json if made.json is not None else json_text(report)
        try:
            write_text(text, ns.json)
        except OSError as exc:  # checked before the job started, but folders can vanish meanwhile
            fallback = session.dir / "report.json"
            write_text(text, str(fallback))
            print(f"advisor: could not write {ns.json} ({exc.strerror or exc}); the report is in {fallback}",
                  file=sys.stderr, flush=True)
    fmt = getattr(ns, "format", "text")
    if getattr(ns, "report", None):
        buffer = io.StringIO()
        emit_report(report, fmt, buffer)
        write_text(buffer.getvalue(), ns.report)
        print(f"advisor: wrote report {ns.report}", file=sys.stderr, flush=True)
    elif ns.headless:
        emit_report(report, fmt, sys.stderr)
    else:
        print_exit_summary(report)
    if not ns.headless:  # the script's output went to a file, not the terminal: say where, last
        print(f"advisor: the script's whole output (stdout and stderr) is in {session.output_path}",
              file=sys.stderr, flush=True)
    print(f"advisor: {plain_text(reason)} (exit code {code}); session {session.id}", file=sys.stderr, flush=True)
    if ns.apply and ns.headless and not _applied(state, ns.apply):
        # `auto` is a wish, not an order: the script's exit code stands, and the reason was said
        # (stderr and the report's warnings). A named remedy that never ran keeps exit 1, with why.
        if ns.apply == "auto":
            said = any(w.startswith("--apply auto applied nothing") for w in report.get("warnings") or [])
            if not said:
                print("advisor: --apply auto applied nothing: no advice was ready before the job ended",
                      file=sys.stderr, flush=True)
            return code
        print(f"advisor: the requested --apply {ns.apply} never happened: {_why_not_applied(state, ns.apply)}",
              file=sys.stderr, flush=True)
        return code or 1
    return code


def _why_not_applied(state: Any, request: str) -> str:
    rec = next((r for r in state.recommendations if r.id == request), None)
    if rec is None:
        ids = ", ".join(r.id for r in state.recommendations) or "none"
        return f"no such recommendation in this run (recommendations: {ids})"
    if rec.apply_class == "restart" or not rec.live:
        return "restart remedies are applied with --plan (advisor plan SESSION, then advisor attach --plan FILE)"
    return "the job ended before the step it was asked for, or it was refused (see the warnings above)"


def _applied(state: Any, request: str) -> bool:
    """Whether the remedy asked for with --apply was applied (kept, reverted or failed: it ran)."""
    return any(request == "auto" or a.recommendation_id == request for a in state.applied)
