"""In-process sessions: the advisor around a loop in the user's own process.

    import advisor

    with advisor.session(memory_budget="12GiB") as s:
        for step in range(steps):
            ...                      # the loop, unchanged
    s.report()                       # the report, as `advisor report` gives it

For notebooks, launchers that run ``python -m``, and trainers (advisor/integrations/): anywhere
``advisor attach SCRIPT`` cannot wrap the launch. The agent runs in this process for the block
(its hooks installed at the start, every one removed at the end, so the script may go on
training after it); the controller runs beside it as a child process (advisor/hosted.py), the
same controller ``attach`` runs, so the session is recorded in the same store and read by
``advisor sessions``, ``report`` and ``open``. The controller never runs user code.

``import advisor`` stays cheap: this module imports only the standard library and our
torch-free modules; the agent (and with it torch, already imported by the user) loads when a
session starts.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterable

from advisor.errors import AdvisorError
from advisor.launch import python_command
from advisor.records.control import ControlClient, ControlError
from advisor.records.settings import decode_settings
from advisor.records.wire import read_secret_file

HOSTED = "advisor.hosted"
START_TIMEOUT_S = 120.0  # the controller imports the report path (numpy) before it answers
FINISH_TIMEOUT_S = 300.0  # it waits for the last records, builds the report, logs to trackers
REPORT_FILE = "report.json"  # advisor.hosted.REPORT_FILE (the controller's side, not imported here)
SESSION_DIR_ENV = "ADVISOR_SESSION_DIR"  # set by `advisor attach` in the training process


def session(name: str | None = None, memory_budget: int | str | None = None, probes: str | Iterable[str] = "all",
            apply: str | None = None, allow_inexact: bool = False,
            log_to: str | Iterable[str] | None = None) -> InProcessSession:
    """A session around the code in its ``with`` block (or between ``start()`` and ``close()``).

    ``name``: the session's name in ``advisor sessions`` (default: the script's). ``memory_budget``:
    bytes or a size such as ``"12GiB"`` (default: the device's memory). ``probes``: ``"all"``,
    ``"none"`` or names (memory, compute, comm). ``apply``: ``"auto"`` or a recommendation id, applied
    live as ``advisor attach --apply`` does; ``allow_inexact``: allow remedies that change numerics.
    ``log_to``: ``"tensorboard"``, ``"mlflow"``, ``"wandb"`` (or ``TOOL:WHERE``), one or several.
    """
    return InProcessSession(name=name, memory_budget=memory_budget, probes=probes, apply=apply,
                            allow_inexact=allow_inexact, log_to=log_to)


def attach_options(*, memory_budget: int | str | None, probes: str | Iterable[str], apply: str | None,
                   allow_inexact: bool, log_to: str | Iterable[str] | None) -> list[str]:
    """The ``advisor attach`` options these arguments mean (the controller parses them as attach does)."""
    options = ["--probes", probes if isinstance(probes, str) else ",".join(probes)]
    if memory_budget is not None:
        options += ["--memory-budget", str(memory_budget)]
    if apply is not None:
        options += ["--apply", apply]
    if allow_inexact:
        options.append("--allow-inexact")
    for target in [log_to] if isinstance(log_to, str) else list(log_to or []):
        options += ["--log-to", target]
    return options


def _agent_present() -> bool:
    """Whether an agent already records this process (``advisor attach``, or a session open)."""
    lifecycle = sys.modules.get("advisor.agent.lifecycle")  # never imported here just to ask
    return bool(lifecycle is not None and lifecycle.present())


def _multi_rank() -> bool:
    """One process of a multi-process job (torchrun, ``accelerate launch``): each rank opens its own
    session with its own controller, which cannot make every rank apply at one boundary."""
    try:
        return int(os.environ.get("WORLD_SIZE") or 1) > 1
    except ValueError:
        return False


MULTI_RANK_APPLY = ("an in-process session of a multi-rank job records each rank on its own and applies nothing: "
                    "`advisor attach --nproc-per-node N` applies remedies on every rank at one step boundary")


def _main_script() -> str | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if isinstance(path, str) and os.path.isfile(path) else None


class InProcessSession:
    """One in-process session: ``with`` it, or ``start()`` and ``close()`` it (a notebook, a callback)."""

    def __init__(self, *, name: str | None, memory_budget: int | str | None, probes: str | Iterable[str],
                 apply: str | None, allow_inexact: bool, log_to: str | Iterable[str] | None) -> None:
        if apply is not None and _multi_rank():
            raise AdvisorError(f"advisor.session(apply={apply!r}): {MULTI_RANK_APPLY}")
        self.name = name
        self._options = attach_options(memory_budget=memory_budget, probes=probes, apply=apply,
                                       allow_inexact=allow_inexact, log_to=log_to)
        self.id: str | None = None
        self.path: Path | None = None
        self.exit_code: int | None = None
        self.exit_reason: str | None = None
        self._borrowed = False  # an agent was already here (advisor attach): this session only reads its
        self._controller: subprocess.Popen | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._run: Any = None  # advisor.agent.lifecycle.AgentRun while open
        self._kineto: str | None = None

    # -- open and close ---------------------------------------------------------------------
    def __enter__(self) -> InProcessSession:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        return self.close(exc)

    @property
    def active(self) -> bool:
        """Whether the agent records this process now (between ``start`` and ``close``)."""
        return self._run is not None

    @property
    def steps(self) -> int:
        """Steps recorded so far (the agent's count; 0 before the first boundary)."""
        return int(self._run.agent.step) if self._run is not None else 0

    def start(self) -> InProcessSession:
        if self._run is not None or self._controller is not None:
            raise AdvisorError("this advisor session is already started; open a new advisor.session()")
        if _agent_present():
            self._borrowed = True
            folder = os.environ.get(SESSION_DIR_ENV)
            self.path = Path(folder) if folder else None
            self.id = self.path.name if self.path else None
            warnings.warn("advisor.session(): the advisor already records this process (advisor attach): this "
                          "session adds nothing; its report() and recommendations() read that session",
                          RuntimeWarning, stacklevel=3)
            return self
        hello = self._start_controller()
        try:
            self._start_agent(hello)
        except BaseException:
            self._end_controller(1)
            raise
        atexit.register(self._close_at_exit)
        return self

    def _start_controller(self) -> dict[str, Any]:
        request = {"name": self.name, "script": _main_script(), "argv": sys.argv[1:], "options": self._options,
                   "pid": os.getpid()}
        # Its own session: a Ctrl-C at the terminal is the script's to handle; the controller ends
        # when this process says so, or when its stdin closes because this process is gone.
        self._controller = subprocess.Popen(python_command(HOSTED, [json.dumps(request)]), stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, text=True, start_new_session=True)
        threading.Thread(target=self._read_lines, name="advisor-session-controller", daemon=True).start()
        hello = self._next_message(START_TIMEOUT_S)
        if hello is None or not hello.get("ok"):
            controller, self._controller = self._controller, None
            try:
                controller.wait(10)
            except subprocess.TimeoutExpired:  # it never answered: ours to stop
                controller.kill()
                controller.wait()
            error = (hello or {}).get("error") or "the advisor's controller did not start"
            raise AdvisorError(f"advisor.session(): {error}", hint=(hello or {}).get("hint"),
                               exit_code=(hello or {}).get("exit_code"))
        self.id, self.path = str(hello["session_id"]), Path(str(hello["dir"]))
        return hello

    def _start_agent(self, hello: dict[str, Any]) -> None:
        from advisor.agent import lifecycle  # torch and the agent load with the first session, not at import

        settings, setting_warnings = decode_settings(hello["settings"])
        # PyTorch's profiler logs into the process's output on each deep step; 6 is above its
        # highest level. Set only for the block, and only where the user set nothing.
        if "KINETO_LOG_LEVEL" not in os.environ:
            os.environ["KINETO_LOG_LEVEL"] = self._kineto = "6"
        run = lifecycle.start(settings, script=_main_script() or f"<{self.name or 'session'}>", argv=sys.argv[1:],
                              started=time.time(), socket_path=str(hello["socket"]),
                              secret=read_secret_file(str(hello["secret_file"])), session_dir=str(self.path),
                              warnings=setting_warnings)
        try:
            run.install_hooks()
            run.adopt_existing()  # what the script built before the block (models are found at their forward)
        except BaseException:  # nothing of the agent may stay behind in the user's process
            run.remove_hooks()
            run.close_channel()
            self._restore_kineto()
            raise
        self._run = run

    def close(self, exc: BaseException | None = None) -> bool:
        """End the session (``exc``: what ended the block, if it raised). True when ``exc`` is the
        agent's own stop, which the block should swallow; the user's exceptions propagate."""
        if self._borrowed or self._run is None:
            return False
        atexit.unregister(self._close_at_exit)
        from advisor.agent.agent import StopTraining
        from advisor.agent.lifecycle import exception_info

        run, self._run = self._run, None
        code, reason, info = 0, "completed", {}
        if isinstance(exc, StopTraining):
            reason = str(exc)
        elif isinstance(exc, KeyboardInterrupt):
            code, reason = 130, "interrupted (Ctrl-C)"
        elif isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            reason = "completed" if code == 0 else f"sys.exit({exc.code!r})"
        elif exc is not None:
            run.on_exception(exc)
            code, reason, info = 1, "exception", exception_info(exc, _main_script())
        try:
            run.remove_hooks()
            run.report_exit(code, reason, info)
            run.close_channel()
        finally:
            self._restore_kineto()
            self._end_controller(code)
        return isinstance(exc, StopTraining)

    def _restore_kineto(self) -> None:
        if self._kineto is not None and os.environ.get("KINETO_LOG_LEVEL") == self._kineto:
            del os.environ["KINETO_LOG_LEVEL"]
        self._kineto = None

    def note(self, message: str) -> None:
        """Add a warning to the session's report (while the session is open; the trainer callbacks
        say so when the trainer's steps and the advisor's differ)."""
        if self._run is not None:
            self._run.agent.outbox.warn(message)

    def _close_at_exit(self) -> None:
        """The interpreter exits with the session open (a notebook kernel, a forgotten ``close``)."""
        self.close()

    def _end_controller(self, code: int) -> None:
        controller, self._controller = self._controller, None
        if controller is None:
            return
        try:
            assert controller.stdin is not None
            controller.stdin.write(json.dumps({"end": code}) + "\n")
            controller.stdin.close()
        except (OSError, ValueError):
            pass
        done = self._next_message(FINISH_TIMEOUT_S)
        if done is not None and done.get("finished"):
            self.exit_code, self.exit_reason = done.get("code"), done.get("reason")
            controller.wait(30)
            print(f"advisor: session {self.id}: {self.exit_reason}; `advisor report {self.id}` shows it",
                  file=sys.stderr, flush=True)
        else:
            print(f"advisor: the session's controller did not finish in {FINISH_TIMEOUT_S:.0f} s; "
                  f"its records are in {self.path}", file=sys.stderr, flush=True)

    def _read_lines(self) -> None:
        controller = self._controller
        assert controller is not None and controller.stdout is not None
        for line in controller.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next_message(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                return message

    # -- reading and acting -----------------------------------------------------------------------
    def _live(self) -> bool:
        return self.path is not None and (self._run is not None or self._borrowed)

    def _request(self, op: str, **args: Any) -> Any:
        if self.path is None:
            raise AdvisorError("this advisor session was never started")
        if self._run is not None and self._run.agent.step > 0:
            # Asked from inside the loop: the answer counts every step closed so far, which the
            # channel may still hold (it sends every 50 ms); the controller waits for them.
            args["until_step"] = int(self._run.agent.step) - 1
        try:
            with ControlClient(self.path) as client:
                return client.request(op, **args)
        except ControlError as exc:
            raise AdvisorError(f"advisor session {self.id}: {exc}") from None

    def report(self) -> dict[str, Any]:
        """The report (``advisor.report/1``, docs/report-schema.md): live while the block runs, the
        final one after it."""
        if self._live():
            return self._request("report")
        if self.path is None:
            raise AdvisorError("this advisor session was never started")
        try:
            return json.loads((self.path / REPORT_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise AdvisorError(f"advisor session {self.id} has no saved report ({exc})",
                               hint=f"`advisor report {self.id}` rebuilds it from the store") from None

    def recommendations(self) -> list[dict[str, Any]]:
        """The ranked recommendations (the report's ``recommendations``), best first."""
        if self._live():
            return list(self._request("advice").get("recommendations") or [])
        return list(self.report().get("recommendations") or [])

    def diagnosis(self) -> dict[str, Any] | None:
        """The diagnosis (the report's ``diagnosis``), or None before anything was measured."""
        if self._live():
            return self._request("advice").get("diagnosis")
        return self.report().get("diagnosis")

    def apply(self, recommendation_id: str, *, confirm: bool = False) -> dict[str, Any]:
        """Apply a live recommendation at the next step boundary the loop reaches (as the TUI's
        ``a``). ``confirm=True`` is the user's consent to a remedy that changes numerics
        (``live-opt-in``). Raises ``AdvisorError`` with the reason when it is refused."""
        if not self._live():
            raise AdvisorError("the session has ended: there is no running loop to apply a remedy to")
        if _multi_rank() and not self._borrowed:
            raise AdvisorError(MULTI_RANK_APPLY)
        return dict(self._request("apply", recommendation_id=recommendation_id, confirm=confirm))

    def revert(self, recommendation_id: str | None = None) -> dict[str, Any]:
        """Revert the remedy in force (the last one kept) at the next step boundary."""
        if not self._live():
            raise AdvisorError("the session has ended: nothing to revert")
        if _multi_rank() and not self._borrowed:
            raise AdvisorError(MULTI_RANK_APPLY)
        return dict(self._request("revert", recommendation_id=recommendation_id))
