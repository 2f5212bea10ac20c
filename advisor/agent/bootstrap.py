"""Entry point of a training process, started by ``advisor.launch`` with ``SCRIPT [ARGS...]``.

The controller (or torchrun, once per rank) starts this module with the
session's settings in the environment. It installs the agent's hooks, then
runs SCRIPT exactly as ``python SCRIPT ARGS`` would (same ``sys.argv``,
``sys.path[0]`` the script's folder, ``__name__ == "__main__"``), records how
it ended, and exits with the script's own exit code.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from typing import Any, Callable, ContextManager

SESSION_ENV = "ADVISOR_SESSION_DIR"
CONFIG_ENV = "ADVISOR_CONFIG"


class Terminated(BaseException):
    """SIGTERM turned into an exception so the exit is recorded (torchrun sends it to stop ranks)."""


def user_frame(tb: Any, script: str) -> dict[str, Any] | None:
    """The innermost traceback frame in the user's code (not torch, not this package)."""
    frames = traceback.extract_tb(tb)
    script_dir = os.path.dirname(os.path.abspath(script))
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def is_user(path: str) -> bool:
        path = os.path.abspath(path)
        return (path.startswith(script_dir) and not path.startswith(here + os.sep)
                and "site-packages" not in path and not path.startswith(sys.prefix))

    chosen = next((f for f in reversed(frames) if is_user(f.filename)), None)
    if chosen is None:
        chosen = next((f for f in reversed(frames) if os.path.abspath(f.filename) == os.path.abspath(script)), None)
    if chosen is None:
        return None
    return {"file": chosen.filename, "line": chosen.lineno, "function": chosen.name, "code": chosen.line or ""}


def exit_code_of(exc: SystemExit) -> int:
    """The process exit code Python would use for ``sys.exit(value)``."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


def main(argv: list[str] | None = None, *,
         around_script: Callable[[Any, Any], ContextManager[Any]] | None = None) -> int:
    """Run the script under the agent. ``around_script(agent, run_info)``: a context entered just around the
    script's run, after the agent and its hooks are in place and left before they go (``advisor
    fit``'s fake world, ``advisor.fit.bootstrap``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("advisor agent: usage: bootstrap SCRIPT [ARGS...] (started by advisor attach)", file=sys.stderr)
        return 2
    script, script_args = args[0], args[1:]
    started = time.time()

    import torch  # noqa: F401  (after argv checks: importing torch takes seconds)

    from advisor.agent.agent import Agent, StopTraining, env_rank
    from advisor.agent.channel import AgentChannel
    from advisor.agent.hooks import install
    from advisor.agent.probe_registry import build_probes, device_info
    from advisor.records.samples import Event, ExitInfo, RunInfo
    from advisor.records.settings import SettingsError, decode_settings
    from advisor.records.wire import SECRET_ENV, SOCKET_ENV, read_secret_file

    try:  # decoded once, here: every part of the agent reads typed settings
        settings, setting_warnings = decode_settings(os.environ.get(CONFIG_ENV))
    except SettingsError as exc:
        print(f"advisor agent: {exc}", file=sys.stderr)
        print("hint: the training process is started by `advisor attach`, which writes "
              f"{CONFIG_ENV}; are the controller and this agent the same version?", file=sys.stderr)
        return 2
    rank, local_rank, world_size = env_rank()
    session_dir = os.environ.get(SESSION_ENV)
    secret_file = os.environ.get(SECRET_ENV)
    secret = read_secret_file(secret_file) if secret_file else b""
    agent_holder: list[Agent] = []

    def on_command(command: dict[str, Any]) -> None:
        if agent_holder:
            agent_holder[0].submit_command(command)

    channel = AgentChannel(
        os.environ.get(SOCKET_ENV) if secret else None,
        secret,
        spill_path=os.path.join(session_dir, f"spill-rank{rank}.jsonl") if session_dir else None,
        on_command=on_command,
        rank=rank,
    )

    def emit(record: Any) -> None:
        channel.emit({"kind": record.KIND, "data": record.to_dict()})

    probes, probe_warnings = build_probes(settings)
    agent = Agent(emit=emit, settings=settings, probes=probes, rank=rank, world_size=world_size)
    agent_holder.append(agent)
    run_info = RunInfo(
        script=os.path.abspath(script), argv=script_args, rank=rank, local_rank=local_rank,
        world_size=world_size, pid=os.getpid(), hostname=socket.gethostname(), started_at=started,
        torch_version=torch.__version__, python_version=sys.version.split()[0],
        device=device_info(local_rank), config=settings.to_dict(),
        restart_count=_restart_count(),
    )
    agent.outbox.emit(run_info)
    for warning in [*setting_warnings, *probe_warnings]:
        agent.outbox.emit(Event(rank=rank, name="warning", data={"message": warning}))
    agent.attach_probes()
    agent.load_plan(settings.plan)
    # A forked DataLoader worker inherits the hooks but not the sender thread: switch it off there.
    os.register_at_fork(after_in_child=lambda: setattr(agent, "disabled", True))
    previous_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise Terminated("terminated by SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    hooks = install(agent)

    sys.argv = [script, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    # The top-level name is the user's: their own advisor.py (or package) must import as it does
    # under python. Our modules were all imported above and stay reachable by their full names.
    sys.modules.pop("advisor", None)
    code, reason = 0, "completed"
    exc_info: dict[str, Any] = {}
    try:
        with around_script(agent, run_info) if around_script is not None else contextlib.nullcontext():
            runpy.run_path(script, run_name="__main__")
    except StopTraining as exc:
        code, reason = 0, str(exc)
    except SystemExit as exc:
        code = exit_code_of(exc)
        reason = "completed" if code == 0 else f"sys.exit({exc.code!r})"
    except KeyboardInterrupt:
        code, reason = 130, "interrupted (Ctrl-C)"
    except Terminated:
        code, reason = 143, "terminated by SIGTERM"
    except BaseException as exc:  # the user's exception: record it, then report it as Python would
        agent.probes.call_all("on_exception", exc)
        code, reason = 1, "exception"
        exc_info = {"exc_type": type(exc).__name__, "message": str(exc)[:2000],
                    "frame": user_frame(exc.__traceback__, script)}
        traceback.print_exception(exc)
    finally:
        try:
            hooks.remove()
            agent.close()
        except Terminated:  # stopped again while closing: what was recorded still goes out below
            pass
    if agent.step == 0 and code == 0:
        agent.outbox.emit(Event(rank=rank, name="warning", data={
            "message": "the script never called an optimizer step nor backward(): no training steps were recorded"}))
    # The exit record goes out first (the channel sends it at once): a launcher whose other node
    # failed SIGTERMs this process while the relay below still waits for the verdict on its peers.
    agent.outbox.emit(ExitInfo(rank=rank, code=code, reason=reason, steps=agent.step, **exc_info))
    if agent.relay is not None:  # a failing rank learns whether a peer on another node went away
        try:
            agent.relay.close(code)
        except Terminated:  # stopped while waiting: what it knew is sent below
            pass
    signal.signal(signal.SIGTERM, previous_term)
    channel.close(timeout=5.0)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _restart_count() -> int:
    try:
        return max(0, int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0))
    except ValueError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
