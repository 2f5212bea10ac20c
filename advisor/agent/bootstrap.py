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
import sys
import time
import traceback
from typing import Any, Callable, ContextManager

SESSION_ENV = "ADVISOR_SESSION_DIR"
CONFIG_ENV = "ADVISOR_CONFIG"


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

    from advisor.agent.agent import StopTraining
    from advisor.agent.lifecycle import Terminated, exception_info, start
    from advisor.records.settings import SettingsError, decode_settings
    from advisor.records.wire import SECRET_ENV, SOCKET_ENV, read_secret_file

    try:  # decoded once, here: every part of the agent reads typed settings
        settings, setting_warnings = decode_settings(os.environ.get(CONFIG_ENV))
    except SettingsError as exc:
        print(f"advisor agent: {exc}", file=sys.stderr)
        print("hint: the training process is started by `advisor attach`, which writes "
              f"{CONFIG_ENV}; are the controller and this agent the same version?", file=sys.stderr)
        return 2
    secret_file = os.environ.get(SECRET_ENV)
    run = start(settings, script=os.path.abspath(script), argv=script_args, started=started,
                socket_path=os.environ.get(SOCKET_ENV), secret=read_secret_file(secret_file) if secret_file else b"",
                session_dir=os.environ.get(SESSION_ENV), warnings=setting_warnings)
    previous_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise Terminated("terminated by SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    run.install_hooks()

    sys.argv = [script, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    # The top-level name is the user's: their own advisor.py (or package) must import as it does
    # under python. Our modules were all imported above and stay reachable by their full names.
    sys.modules.pop("advisor", None)
    code, reason = 0, "completed"
    exc_info: dict[str, Any] = {}
    try:
        with around_script(run.agent, run.run_info) if around_script is not None else contextlib.nullcontext():
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
        run.on_exception(exc)
        code, reason = 1, "exception"
        exc_info = exception_info(exc, script)
        traceback.print_exception(exc)
    finally:
        run.remove_hooks()
    run.report_exit(code, reason, exc_info)
    signal.signal(signal.SIGTERM, previous_term)
    run.close_channel()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
