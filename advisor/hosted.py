"""The controller of an in-process session (``advisor.session()``, advisor/api.py).

The user's process runs the agent around its own loop; this controller runs beside it as a child
process, started through ``advisor.launch.python_command`` (never running user code), and is the
same controller ``advisor attach`` runs: a ``Session`` with its store and channel, an
``AdviceLoop``, the control path (advisor/control_server.py), and at the end the report, saved in
the session folder (``report.json``) and sent to ``--log-to`` trackers. Only the training process
differs: it is not launched here but is the parent, so ``HostedSession`` never signals it.

The parent and this process talk over this process's stdin and stdout, one JSON object a line:

- argv: one JSON object ``{"name", "script", "argv", "options"}``; ``options`` are
  ``advisor attach`` options, parsed by attach's own parser (same checks, same messages);
- this process answers ``{"ok": true, "session_id", "dir", "socket", "secret_file", "settings"}``
  (the agent's settings as ``advisor.records.settings`` encodes them) or ``{"ok": false, "error",
  "hint", "exit_code"}``;
- the parent sends ``{"end": CODE}`` when its block ends (after its agent flushed its records); end
  of input without it means the parent went away (killed, ``os._exit``, a kernel restart);
- this process answers ``{"finished": true, "code", "reason", "report"}`` (the report's path)
  and exits.

Anything else this process prints goes to stderr: stdout is the protocol's alone.
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any

from advisor.advice import AdviceLoop
from advisor.cli import agent_settings, build_parser, check_log_targets, parse_args
from advisor.control_server import ControlOps, ControlServer
from advisor.errors import EXIT_USAGE, AdvisorError
from advisor.paths import restrict_umask
from advisor.records.settings import encode_settings
from advisor.report import build_report, write_json
from advisor.controller import AttachOptions, Session
from advisor.trackers import log_report

REPORT_FILE = "report.json"


class HostedSession(Session):
    """A ``Session`` whose training process is the parent that started this controller."""

    def __init__(self, options: AttachOptions, *, commands: IO[str], owner_pid: int, script: str) -> None:
        super().__init__(options)
        self._commands = commands
        self._returncode: int | None = None
        self._ended = False
        self.store.set_meta(script=script, in_process={"pid": owner_pid, "name": options.label})

    def start(self) -> None:
        """Nothing to launch: the training process is already running (it started us)."""

    def poll(self) -> int | None:
        return self._returncode if self._ended else None

    def wait(self) -> int:
        """Until the parent says its block ended (or goes away); its code, or None if it went away."""
        code: int | None = None
        for line in self._commands:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and isinstance(message.get("end"), int):
                code = message["end"]
                break
        self._returncode, self._ended = code, True
        return code  # type: ignore[return-value]  # None: decide_exit's "unknown"

    def terminate(self, grace: float = 10.0) -> None:
        """Never: the training process is the user's own (a notebook, a Trainer) and outlives us."""

    def kill(self) -> None:
        """Never, as ``terminate``."""


def _send(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    restrict_umask()
    # The protocol keeps this process's stdout; anything printed (a library, a warning) goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        request = json.loads(args[0]) if args else None
        if not isinstance(request, dict) or not isinstance(request.get("options", []), list):
            raise AdvisorError("advisor.hosted is started by advisor.session(), not by hand", exit_code=EXIT_USAGE)
        ns = parse_args(build_parser(), ["attach", *[str(o) for o in request.get("options", [])]])
        check_log_targets(ns.log_to)
        settings = agent_settings(ns)
        name = request.get("name") if isinstance(request.get("name"), str) else None
        script = request.get("script") if isinstance(request.get("script"), str) else None
        owner = request.get("pid") if isinstance(request.get("pid"), int) else os.getppid()
        options = AttachOptions(script=script or f"<{name or 'session'}>", label=name or script or "session",
                                args=[str(a) for a in request.get("argv") or []], settings=settings)
        session = HostedSession(options, commands=sys.stdin, owner_pid=owner, script=options.script)
    except AdvisorError as exc:
        _send(out, {"ok": False, "error": str(exc), "hint": exc.hint, "exit_code": exc.exit_code})
        return exc.exit_code
    advice = AdviceLoop(session, budget_bytes=settings.memory_budget_bytes, apply=ns.apply,
                        apply_at_step=ns.apply_at_step)
    session.add_listener(advice.on_record)
    control: ControlServer | None = None
    try:
        control = ControlServer(session.dir, ControlOps(session, advice, budget_bytes=ns.memory_budget))
        _send(out, {"ok": True, "session_id": session.id, "dir": str(session.dir), "socket": session.server.path,
                    "secret_file": session.secret_file, "settings": encode_settings(settings)})
        returncode = session.wait()
        note = "" if returncode is not None else "; the process that opened the session went away without closing it"
        code, reason = session.finish(returncode, note=note)
        control.close()
        advice.finish()
        report = build_report(session.live.snapshot(), budget_bytes=ns.memory_budget)
        session.save_analysis(diagnosis=report.get("diagnosis"), recommendations=report.get("recommendations"))
        path = session.dir / REPORT_FILE
        write_json(report, str(path))
        log_report(report, ns.log_to or [])
        _send(out, {"finished": True, "code": code, "reason": reason, "report": str(path)})
        return 0
    except BrokenPipeError:  # the parent is gone: the session is recorded all the same
        return 0
    finally:
        if control is not None:
            control.close()
        advice.close()
        session.close()


if __name__ == "__main__":
    sys.exit(main())
