"""An agent's life in a process: started, its hooks installed and removed, its end reported.

Two callers. The bootstrap (``advisor attach``) starts an agent for the whole process and runs the
script with runpy under it. An in-process session (``advisor.session()``, advisor/api.py) starts
one for a ``with`` block in the user's own process, which goes on after the block: there the
hooks come off at its end (every wrapped function restored), nothing of the process's own is
changed for good (no signal handler, no ``sys.argv``, no ``sys.modules`` entry), and what the
script built before the block is found by ``AgentRun.adopt_existing``.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
import weakref
from typing import Any

import torch

from advisor.agent.agent import Agent, env_rank
from advisor.agent.channel import AgentChannel
from advisor.agent.hooks import InstalledHooks, install
from advisor.agent.probe_registry import build_probes, device_info
from advisor.records.samples import Event, ExitInfo, RunInfo
from advisor.records.settings import AgentSettings


class Terminated(BaseException):
    """SIGTERM turned into an exception so the exit is recorded (torchrun sends it to stop ranks)."""


# Every agent started in this process and not closed. A forked child (a DataLoader worker)
# inherits the hooks but not the sender thread: the agents are switched off there.
_LIVE: weakref.WeakSet[Agent] = weakref.WeakSet()
_FORK_HOOK: list[bool] = []  # registered once per process (os.register_at_fork cannot be undone)


def _disable_in_child() -> None:
    for agent in list(_LIVE):
        agent.disabled = True


def present() -> bool:
    """Whether an agent records this process now (under ``advisor attach``, or a session open)."""
    return any(not agent.disabled for agent in list(_LIVE))


def user_frame(tb: Any, script: str | None) -> dict[str, Any] | None:
    """The innermost traceback frame in the user's code (not torch, not this package).
    ``script`` None (a notebook, ``python -c``): any frame outside this package and the libraries."""
    frames = traceback.extract_tb(tb)
    script_dir = os.path.dirname(os.path.abspath(script)) if script else ""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def is_user(path: str) -> bool:
        path = os.path.abspath(path)
        return (path.startswith(script_dir) and not path.startswith(here + os.sep)
                and "site-packages" not in path and not path.startswith(sys.prefix))

    chosen = next((f for f in reversed(frames) if is_user(f.filename)), None)
    if chosen is None and script:
        chosen = next((f for f in reversed(frames) if os.path.abspath(f.filename) == os.path.abspath(script)), None)
    if chosen is None:
        return None
    return {"file": chosen.filename, "line": chosen.lineno, "function": chosen.name, "code": chosen.line or ""}


def exception_info(exc: BaseException, script: str | None) -> dict[str, Any]:
    """``ExitInfo``'s fields for a script that raised ``exc``."""
    return {"exc_type": type(exc).__name__, "message": str(exc)[:2000], "frame": user_frame(exc.__traceback__, script)}


class AgentRun:
    """One started agent with its channel: hooks on, hooks off, the end reported."""

    def __init__(self, agent: Agent, channel: AgentChannel, rank: int, run_info: RunInfo) -> None:
        self.agent, self.channel, self.rank = agent, channel, rank
        self.run_info = run_info  # what was sent of this run (advisor fit's fake world reads it)
        self.hooks: InstalledHooks | None = None

    def install_hooks(self) -> None:
        self.hooks = install(self.agent)

    def adopt_existing(self) -> int:
        """Find what the script built before the hooks (an in-process session opened mid-script):
        its optimizers, schedulers, wrappers and DataLoaders; how many were found."""
        return self.agent.objects.adopt_existing()

    def on_exception(self, exc: BaseException) -> None:
        """The script raised ``exc``: the probes record what it cut short (an OOM's partial step)."""
        self.agent.probes.call_all("on_exception", exc)

    def remove_hooks(self) -> None:
        """Uninstall every hook and close the agent (the last step, pending samples, the probes)."""
        try:
            if self.hooks is not None:
                self.hooks.remove()
                self.hooks = None
            self.agent.close()
        except Terminated:  # stopped again while closing: what was recorded still goes out
            pass
        finally:
            _LIVE.discard(self.agent)

    def report_exit(self, code: int, reason: str, exc_info: dict[str, Any] | None = None) -> None:
        """Send how the script ended (at once), then let a multi-node relay learn of its peers."""
        agent = self.agent
        if agent.step == 0 and code == 0:
            agent.outbox.emit(Event(rank=self.rank, name="warning", data={
                "message": "the script never called an optimizer step nor backward(): no training steps were recorded"}))
        # The exit record goes out first (the channel sends it at once): a launcher whose other node
        # failed SIGTERMs this process while the relay below still waits for the verdict on its peers.
        agent.outbox.emit(ExitInfo(rank=self.rank, code=code, reason=reason, steps=agent.step, **(exc_info or {})))
        if agent.relay is not None:  # a failing rank learns whether a peer on another node went away
            try:
                agent.relay.close(code)
            except Terminated:  # stopped while waiting: what it knew is sent below
                pass

    def close_channel(self) -> None:
        """Flush what is left (at most 5 s) and close the channel."""
        self.channel.close(timeout=5.0)


def start(settings: AgentSettings, *, script: str, argv: list[str], started: float, socket_path: str | None,
          secret: bytes, session_dir: str | None, warnings: list[str] | None = None) -> AgentRun:
    """Connect to the controller, build the agent and its probes, send the run's ``RunInfo``.
    The hooks are not installed yet (``AgentRun.install_hooks``)."""
    rank, local_rank, world_size = env_rank()
    holder: list[Agent] = []

    def on_command(command: dict[str, Any]) -> None:
        if holder:
            holder[0].submit_command(command)

    channel = AgentChannel(
        socket_path if secret else None,
        secret,
        spill_path=os.path.join(session_dir, f"spill-rank{rank}.jsonl") if session_dir else None,
        on_command=on_command,
        rank=rank,
    )

    probes, probe_warnings = build_probes(settings)
    agent = Agent(emit=channel.emit_record, settings=settings, probes=probes, rank=rank, world_size=world_size, drain=channel.drain)
    holder.append(agent)
    run_info = RunInfo(
        script=script, argv=argv, rank=rank, local_rank=local_rank,
        world_size=world_size, pid=os.getpid(), hostname=socket.gethostname(), started_at=started,
        torch_version=torch.__version__, python_version=sys.version.split()[0],
        device=device_info(local_rank), config=settings.to_dict(),
        restart_count=_restart_count(),
    )
    agent.outbox.emit(run_info)
    for warning in [*(warnings or []), *probe_warnings]:
        agent.outbox.emit(Event(rank=rank, name="warning", data={"message": warning}))
    agent.attach_probes()
    agent.load_plan(settings.plan)
    _LIVE.add(agent)
    if not _FORK_HOOK:
        _FORK_HOOK.append(True)
        os.register_at_fork(after_in_child=_disable_in_child)
    return AgentRun(agent, channel, rank, run_info)


def _restart_count() -> int:
    try:
        return max(0, int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0))
    except ValueError:
        return 0
