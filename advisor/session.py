"""One attach session: store, channel, the training process(es), and how they ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from advisor.launch import BOOTSTRAP, python_command, torchrun_command
from advisor.paths import DB_NAME, new_session_dir
from advisor.server import ChannelServer
from advisor.state import LiveState, SessionState
from advisor.store import SessionStore
from advisor.records.commands import Command
from advisor.records.samples import ExitInfo, Record
from advisor.records.wire import SECRET_ENV, SOCKET_ENV, new_secret, write_secret_file

@dataclass
class AttachOptions:
    script: str
    args: list[str] = field(default_factory=list)
    nproc_per_node: int = 1
    max_steps: int | None = None
    capture_output: bool = False  # TUI mode: the script's output goes to output.log
    agent_config: dict[str, Any] = field(default_factory=dict)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Session:
    def __init__(self, options: AttachOptions) -> None:
        self.options = options
        self.dir = new_session_dir(options.script)
        self.id = self.dir.name
        self.db_path = self.dir / DB_NAME
        self.store = SessionStore(self.db_path)
        self.live = LiveState(session_id=self.id, session_path=str(self.dir))
        self._listeners: list[Callable[[Record], None]] = []
        self._secret = new_secret()
        self._secret_file = self.dir / "secret"
        write_secret_file(str(self._secret_file), self._secret)
        self.server = ChannelServer(self._secret, self._on_record)
        self.process: subprocess.Popen | None = None
        self.output_path = self.dir / "output.log"
        self.store.set_meta(session_id=self.id, script=os.path.abspath(options.script), argv=options.args,
                            created=time.time(), nproc_per_node=options.nproc_per_node, finished=False)

    # -- records -----------------------------------------------------------------------
    def add_listener(self, listener: Callable[[Record], None]) -> None:
        self._listeners.append(listener)

    def _on_record(self, record: Record) -> None:
        self.store.put(record)
        self.live.add(record)
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # a UI callback must never stop the recording
                pass

    def send_command(self, command: Command | dict[str, Any]) -> int:
        """Send a command to every connected rank; returns how many received it."""
        return self.server.broadcast(command if isinstance(command, dict) else command.to_dict())

    # -- the training process ----------------------------------------------------------
    def command_line(self) -> list[str]:
        opts = self.options
        if opts.nproc_per_node > 1:
            return torchrun_command(opts.nproc_per_node, BOOTSTRAP, [opts.script, *opts.args])
        return python_command(BOOTSTRAP, [opts.script, *opts.args])

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        config = dict(self.options.agent_config)
        if self.options.max_steps is not None:
            config["max_steps"] = self.options.max_steps
        env.update({
            SOCKET_ENV: self.server.path,
            SECRET_ENV: str(self._secret_file),
            "ADVISOR_SESSION_DIR": str(self.dir),
            "ADVISOR_CONFIG": json.dumps(config),
            "PYTHONUNBUFFERED": "1",
        })
        env.update(config.get("plan_env") or {})  # a plan's restart remedies (advisor.records.plan)
        return env

    def start(self) -> None:
        out = None
        if self.options.capture_output:
            fd = os.open(self.output_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            out = os.fdopen(fd, "wb")
        try:
            self.process = subprocess.Popen(
                self.command_line(), env=self.environment(),
                stdout=out, stderr=subprocess.STDOUT if out else None, stdin=subprocess.DEVNULL,
            )
        finally:
            if out is not None:
                out.close()

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def wait(self) -> int:
        """Wait for the training process; Ctrl-C is passed on to it, not acted on here."""
        assert self.process is not None
        while True:
            try:
                return self.process.wait()
            except KeyboardInterrupt:
                # The terminal sent SIGINT to the whole process group: the script
                # got it too and decides (usually exits with KeyboardInterrupt).
                continue

    def terminate(self, grace: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def finish(self, returncode: int) -> tuple[int, str]:
        """Collect the last records and decide the exit code and reason; closes the store."""
        self.server.wait_readers(timeout=5.0)
        state = self.live.snapshot()
        code, reason = decide_exit(state, returncode, self.options.nproc_per_node)
        self.live.update(finished=True, exit_code=code, exit_reason=reason, pending_apply=None)
        self.store.set_meta(finished=True, exit_code=code, exit_reason=reason)
        return code, reason

    def save_analysis(self, *, diagnosis: Any, recommendations: Any) -> None:
        self.store.set_meta(diagnosis=diagnosis, recommendations=recommendations)

    def close(self) -> None:
        self.server.close()
        self.store.close()
        try:
            self._secret_file.unlink()  # the secret is only needed while agents run
        except OSError:
            pass


def decide_exit(state: SessionState, returncode: int, nproc: int) -> tuple[int, str]:
    """The script's exit code and a one-line reason, from its agents' reports or the OS."""
    exits: list[ExitInfo] = [state.exits[r] for r in sorted(state.exits)]
    failing = [e for e in exits if e.code != 0]
    if failing:
        first = failing[0]
        where = f" on rank {first.rank}" if nproc > 1 else ""
        if first.exc_type:
            frame = first.frame or {}
            at = f" at {frame.get('file')}:{frame.get('line')} in {frame.get('function')}" if frame else ""
            return first.code, f"{first.exc_type}: {first.message}{at}{where}"
        return first.code, f"{first.reason}{where}"
    if returncode < 0:
        name = signal_name(-returncode)
        hint = " (the kernel's OOM killer sends SIGKILL when host memory runs out)" if name == "SIGKILL" else ""
        return 128 + (-returncode), f"training process killed by {name}{hint}"
    if returncode != 0 and not exits:
        return returncode, f"training process exited with code {returncode} before its agent reported"
    if len(exits) < nproc and returncode != 0:
        missing = sorted(set(range(nproc)) - set(state.exits))
        return returncode, f"rank(s) {missing} died without reporting (exit code {returncode})"
    if exits:
        reason = exits[0].reason
        if exits[0].steps == 0:
            reason += "; the script never called an optimizer step, so no training steps were recorded"
        return (returncode if returncode and not exits else exits[0].code), reason
    return returncode, "completed"

