"""One attach session: store, channel, the training process(es), and how they ended."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from advisor.errors import EXIT_LAUNCH, AdvisorError
from advisor.exits import (
    LAUNCHER_CODE,
    LAUNCHER_EXITS,
    decide_exit,
    read_launcher_exits,
    read_rendezvous_failure,
    rendezvous_lost_reason,
    stop_note,
)
from advisor.launch import BOOTSTRAP, python_command, torchrun_command
from advisor.multinode import MultiNode
from advisor.output_tail import OUTPUT_LOG, OutputFollower
from advisor.paths import DB_NAME, new_session_dir, user_umask
from advisor.records.commands import Command
from advisor.records.plan import env_refusal
from advisor.records.events import Job, PeerExit, PeerLost, WarningEvent, payload
from advisor.records.samples import Event, Record, RunInfo
from advisor.records.settings import AgentSettings, encode_settings
from advisor.regime import interrupted_applies
from advisor.records.wire import SECRET_ENV, SOCKET_ENV, new_secret, write_secret_file
from advisor.server import ChannelServer
from advisor.state import LiveState, SessionState
from advisor.store import STORE_SPILL, SessionStore

DEAD_RANK_GRACE_S = 30.0  # a rank died while others run: how long before the job is stopped


def _is_our_rank(pid: int) -> bool:
    """Whether ``pid`` is still a training process started through our bootstrap (a pid is reused
    once its process is gone: never signal one that is not). Without /proc, no."""
    if pid <= 1 or pid == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return BOOTSTRAP.encode() in handle.read()
    except OSError:
        return False


@dataclass
class AttachOptions:
    script: str
    args: list[str] = field(default_factory=list)
    nproc_per_node: int = 1
    max_steps: int | None = None
    capture_output: bool = False  # TUI mode: the script's output goes to output.log
    settings: AgentSettings = field(default_factory=AgentSettings)  # the training process's (advisor.cli)
    multinode: MultiNode = field(default_factory=MultiNode)  # this controller's place in a multi-node job
    label: str | None = None  # the session folder's name after its time (default: the script's stem)
    bootstrap: str = BOOTSTRAP  # the module the training process runs (``advisor fit``: advisor.fit.bootstrap)
    env: dict[str, str] = field(default_factory=dict)  # added to its environment (a fit's world: RANK, ...)


class Session:
    def __init__(self, options: AttachOptions) -> None:
        self.options = options
        self.dir = new_session_dir(options.label or options.script)
        self.id = self.dir.name
        self.db_path = self.dir / DB_NAME
        self.live = LiveState(session_id=self.id, session_path=str(self.dir))
        self._listeners: list[Callable[[Record], None]] = []
        self._job_lock = threading.Lock()  # before the store: its failure is recorded like any event
        self.store = SessionStore(self.db_path, on_failure=self._store_failed)
        self._secret = new_secret()
        self._secret_file = self.dir / "secret"
        write_secret_file(str(self._secret_file), self._secret)
        self.server = ChannelServer(self._secret, self._on_record, on_hello=self._on_hello,
                                    on_disconnect=self._on_disconnect, with_origin=True)
        self._dead_rank_timer: threading.Timer | None = None
        self._gone: list[int] = []  # ranks whose agents disconnected, in order
        self._restarts_seen = 0  # the highest RunInfo.restart_count: torchrun restarted the workers
        self._peers_gone: list[Event] = []  # multi-node: other nodes' ranks reported lost or failed
        self._gone_lock = threading.Lock()
        # The ranks whose exit had come when the user stopped the job (``mark_stopped``); None while
        # nobody did. A rank failing after the stop failed because of it (a peer gone).
        self._before_stop: frozenset[int] | None = None
        self.process: subprocess.Popen | None = None
        self.output_path = self.dir / OUTPUT_LOG
        # TUI mode: the controller follows output.log into the live state (the TUI's Output view).
        self.output: OutputFollower | None = None
        self.store.set_meta(session_id=self.id, script=os.path.abspath(options.script), argv=options.args,
                            created=time.time(), nproc_per_node=options.nproc_per_node, finished=False)
        # The job this session is part of (advisor/multinode.py): its id, and the global ranks hosted
        # here as their agents say hello. A single-node job is a job of its own session.
        self.job: dict[str, Any] = options.multinode.describe(nproc_per_node=options.nproc_per_node)
        if self.job["id"] is None:
            self.job["id"] = self.id
        self._save_job()

    @property
    def secret_file(self) -> str:
        """Where the agents read the session's secret (removed once every rank said hello)."""
        return str(self._secret_file)

    # -- the job (multi-node) ----------------------------------------------------------
    @property
    def multinode(self) -> bool:
        return self.options.multinode.active

    def hosted_ranks(self) -> list[int]:
        with self._job_lock:
            return list(self.job["ranks_hosted"])

    def decides(self) -> bool | None:
        """Whether this controller decides for the job: it hosts global rank 0 (None: no rank yet)."""
        if not self.multinode:
            return True
        ranks = self.hosted_ranks()
        return (0 in ranks) if ranks else None

    def _save_job(self) -> None:
        with self._job_lock:
            job = dict(self.job)
        self.live.update(job=job)
        self.store.set_meta(job=job)

    def _note_job(self, record: Record) -> None:
        """Fold what the agents say about the job into its metadata (hello, run info, job token)."""
        changed = False
        with self._job_lock:
            if isinstance(record, RunInfo):
                if self.job.get("world_size") != record.world_size:
                    self.job["world_size"] = record.world_size
                    changed = True
            elif isinstance(record, Event) and record.name == Job.NAME:
                token = Job.of(record).token
                if self.job.get("token") != token:
                    self.job["token"] = token
                    changed = True
        if changed:
            self._save_job()

    # -- records -----------------------------------------------------------------------
    def add_listener(self, listener: Callable[[Record], None]) -> None:
        self._listeners.append(listener)

    def _on_record(self, record: Record, origin: tuple[str | None, int] | None = None) -> None:
        """A record from an agent (``origin``: its connection and frame number) or of our own."""
        if isinstance(record, (RunInfo, Event)):
            self._note_job(record)
        self.store.put(record, origin)
        if isinstance(record, Event) and record.name in (PeerLost.NAME, PeerExit.NAME) and self.multinode:
            self._peer_gone(record)
        if isinstance(record, RunInfo) and record.restart_count > self._restarts_seen:
            self._note_restart(record)
        self.live.add(record)
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # a UI callback must never stop the recording
                pass

    def warn(self, message: str, *, source: str | None = None) -> None:
        """A warning of the controller's own (an --apply decision): stored and in the report."""
        self._on_record(WarningEvent(message=message, source=source).event(rank=0))

    def _store_failed(self, error: str) -> None:
        """The store stopped writing (a full disk): say it now, on the terminal and in the report.
        Recording goes on in memory for this run's report; the exit code stays the script's."""
        message = (f"cannot write the session store ({error}): this run's report keeps every record, the "
                   f"session folder only what fits ({STORE_SPILL} while the disk has room), so a later "
                   f"`advisor report` may lack some; free space under {self.dir.parent}")
        self._on_record(Event(name="warning", data={"message": message, "source": "store"}))

    def send_command(self, command: Command | dict[str, Any]) -> int:
        """Send a command to every connected rank; returns how many received it."""
        return self.server.broadcast(command if isinstance(command, dict) else command.to_dict())

    def _on_hello(self, rank: int) -> None:
        with self._job_lock:
            self.job["ranks_hosted"] = sorted({*self.job["ranks_hosted"], rank})
            self.job["decides"] = 0 in self.job["ranks_hosted"] if self.multinode else True
        self._save_job()
        # Every rank has read it: nothing is left behind if we are killed. Not while torchrun may
        # restart the workers (--max-restarts): each new worker reads it again, and without it the
        # restart the user asked for fails in our bootstrap. It goes at close() then.
        if len(self.server.ranks) >= self.options.nproc_per_node and not self.options.multinode.restarts:
            self._remove_secret()

    def _remove_secret(self) -> None:
        try:
            self._secret_file.unlink()
        except OSError:
            pass

    def _on_disconnect(self, rank: int) -> None:
        """A rank's agent is gone. If it failed while others run, they may be blocked in a collective
        until the backend's timeout: say so now, and stop the job after a bounded grace period."""
        with self._gone_lock:
            self._gone.append(rank)
            if self.options.nproc_per_node < 2 or self._dead_rank_timer is not None:
                return
            # Ranks that fail together disconnect within milliseconds of each other: look at them all.
            self._dead_rank_timer = threading.Timer(0.5, self._warn_dead_rank)
            self._dead_rank_timer.daemon = True
            self._dead_rank_timer.start()

    def _warn_dead_rank(self) -> None:
        if self.poll() is not None:
            return
        state = self.live.snapshot()
        with self._gone_lock:
            gone = list(self._gone)
        silent = [r for r in gone if r not in state.exits]
        failed = [r for r in gone if r in state.exits and state.exits[r].code not in (0, 143)]
        culprits = silent or failed
        if not culprits:
            with self._gone_lock:
                self._dead_rank_timer = None  # clean exits so far: look again at the next one
            return
        rank = culprits[0]
        info = state.exits.get(rank)
        samples = state.steps.get(rank)
        after = f" after step {samples[-1].index}" if samples else ""
        what = (f"exited with code {info.code}" if info is not None
                else "stopped reporting (its connection closed without an exit record)")
        others = []
        for other in sorted(set(self.expected_ranks()) - set(gone)):
            last = next((c.op for c in reversed(state.collectives) if c.rank == other), None)
            others.append(f"rank {other}" + (f" (last collective: {last})" if last else ""))
        if not others:
            return  # every rank is gone: the launcher ends the job by itself
        limit = self.options.multinode.restarts
        if limit > self._restarts_seen:
            # torchrun stops the others and restarts every worker itself: stopping the job here
            # would race the restart the user asked for. (The timer left set marks it as said.)
            message = (f"rank {rank} {what}{after}; torchrun restarts the workers "
                       f"(restart {self._restarts_seen + 1} of --max-restarts {limit})")
            self._on_record(WarningEvent(message=message).event(rank=rank))
            return
        message = (f"rank {rank} {what}{after}; {', '.join(others)} may be waiting for it in a collective: "
                   f"the job is stopped in {DEAD_RANK_GRACE_S:.0f} s unless it ends first")
        self._on_record(WarningEvent(message=message).event(rank=rank))
        self._dead_rank_timer = threading.Timer(DEAD_RANK_GRACE_S, self._stop_after_dead_rank)
        self._dead_rank_timer.daemon = True
        self._dead_rank_timer.start()

    def _note_restart(self, record: RunInfo) -> None:
        """torchrun restarted the workers (``--max-restarts``): the ranks gone before belong to the
        attempt that ended, and a restarted worker counts its steps from 0 again: say so once."""
        with self._gone_lock:
            if record.restart_count <= self._restarts_seen:
                return
            self._restarts_seen = record.restart_count
            self._gone.clear()
            if self._dead_rank_timer is not None:
                self._dead_rank_timer.cancel()
                self._dead_rank_timer = None
        message = (f"torchrun restarted the workers (restart {record.restart_count} of --max-restarts "
                   f"{self.options.multinode.restarts}): their steps count from 0 again")
        self._on_record(WarningEvent(message=message, source="restart").event(rank=record.rank))

    def _peer_gone(self, record: Event) -> None:
        """A rank on another node is gone (no heartbeat) or failed: say so now, and stop this node's
        ranks after a bounded grace if they do not end by themselves (they may wait in a collective)."""
        with self._gone_lock:
            first = not self._peers_gone
            self._peers_gone.append(record)
            if self._dead_rank_timer is not None or self.poll() is not None:
                first = False
        message = f"{_peer_message(record) or 'a peer rank is gone'} (reported by rank {record.rank})"
        if first:
            message += f"; this node's ranks are stopped in {DEAD_RANK_GRACE_S:.0f} s unless they end first"
        self._on_record(WarningEvent(message=message, source="multinode").event(rank=record.rank, step=record.step))
        if first:
            with self._gone_lock:
                self._dead_rank_timer = threading.Timer(DEAD_RANK_GRACE_S, self._stop_after_dead_rank)
                self._dead_rank_timer.daemon = True
                self._dead_rank_timer.start()

    def expected_ranks(self) -> list[int]:
        """The global ranks this controller hosts (those that said hello, else 0..nproc-1)."""
        return self.hosted_ranks() or list(range(self.options.nproc_per_node))

    def _stop_after_dead_rank(self) -> None:
        if self.poll() is None:
            self._terminate(grace=10.0)  # the dead rank's consequence, not a stop anybody asked for

    # -- the training process ----------------------------------------------------------
    def command_line(self) -> list[str]:
        opts = self.options
        if opts.multinode.uses_torchrun(opts.nproc_per_node):
            command = torchrun_command(opts.nproc_per_node, BOOTSTRAP, [opts.script, *opts.args],
                                       rendezvous=opts.multinode.torchrun_options())
            # torchrun as it is, run through LAUNCHER_CODE so that it says which worker failed first.
            assert command[1:3] == ["-m", "torch.distributed.run"], command
            return [command[0], "-c", LAUNCHER_CODE, *command[3:]]
        return python_command(opts.bootstrap, [opts.script, *opts.args])

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # PyTorch's profiler (kineto) logs "USDT: ... profiler_start" lines into the script's
        # output on every deep step; 6 is above its highest level (USDT = 5). A user's own
        # setting wins.
        env.setdefault("KINETO_LOG_LEVEL", "6")
        settings = self.options.settings
        if self.options.max_steps is not None:
            settings = replace(settings, max_steps=self.options.max_steps)
        if self.multinode:  # several controllers: commands relayed from rank 0, heartbeats kept
            settings = replace(settings, multinode=self.options.multinode.agent_settings())
        # A plan's restart remedies (checked when the plan was read; again here, whoever built the
        # settings), then the advisor's own variables, which nothing a plan says may replace.
        env.update(merge_plan_env(env, allowed_plan_env(settings.plan_env)))
        env.update(self.options.env)
        env.update({
            SOCKET_ENV: self.server.path,
            SECRET_ENV: str(self._secret_file),
            "ADVISOR_SESSION_DIR": str(self.dir),
            "ADVISOR_CONFIG": encode_settings(settings),
            "PYTHONUNBUFFERED": "1",
            "ADVISOR_LAUNCHER_EXITS": str(self.dir / LAUNCHER_EXITS),
        })
        return env

    def start(self) -> None:
        out = None
        if self.options.capture_output:
            fd = os.open(self.output_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            out = os.fdopen(fd, "wb")
        try:
            # The script runs as under python: the user's umask (the controller's own files are
            # owner-only), and, headless, the terminal's stdin (pipes, input(), pdb). The TUI owns
            # the terminal, so there the script reads from /dev/null.
            # Under the TUI the job runs in its own session: closing the terminal sends SIGHUP to
            # the terminal's processes, and that must never kill training (advisor/attach.py).
            self.process = subprocess.Popen(
                self.command_line(), env=self.environment(), umask=user_umask(),
                stdout=out, stderr=subprocess.STDOUT if out else None,
                stdin=subprocess.DEVNULL if self.options.capture_output else None,
                start_new_session=self.options.capture_output,
            )
        finally:
            if out is not None:
                out.close()
        if self.options.capture_output:
            self.output = OutputFollower(self.output_path, self.live.append_output)
            self.output.start()

    def launch(self, what: str = "training process") -> None:
        """``start``, or close the session and raise the launch error (exit code 4) naming ``what``."""
        try:
            self.start()
        except OSError as exc:
            self.close()
            raise AdvisorError(f"could not start the {what}: {exc}", exit_code=EXIT_LAUNCH) from None

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
                # Under the TUI it runs in a session of its own: pass Ctrl-C on.
                self.mark_stopped()
                if self.options.capture_output and self.process.poll() is None:
                    self.process.send_signal(signal.SIGINT)
                continue

    def mark_stopped(self) -> None:
        """The user (Ctrl-C, the TUI's stop, a signal to attach) stops the job now: ranks that fail
        after this failed because of it (``decide_exit``'s ``before_stop``)."""
        if self._before_stop is None:
            self._before_stop = frozenset(self.live.snapshot().exits)

    def terminate(self, grace: float = 10.0) -> None:
        """Stop the job on the user's behalf: SIGTERM, SIGKILL after ``grace`` seconds."""
        if self.process is not None and self.process.poll() is None:
            self.mark_stopped()
        self._terminate(grace)

    def _terminate(self, grace: float) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL to the launched process and to this node's ranks. A SIGKILLed torchrun cannot
        stop its workers, and a rank blocked in native code (a collective, gloo's connect) never
        runs its SIGTERM handler: they stayed behind, training or hung, with nobody recording."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        here, hosted = socket.gethostname(), set(self.hosted_ranks())
        for rank, run in self.live.snapshot().runs.items():
            if (hosted and rank not in hosted) or (run.hostname and run.hostname != here):
                continue
            if _is_our_rank(run.pid):
                try:
                    os.kill(run.pid, signal.SIGKILL)
                except OSError:  # gone in the meantime
                    pass

    def finish(self, returncode: int, note: str = "") -> tuple[int, str]:
        """Collect the last records and decide the exit code and reason; closes the store."""
        self.server.wait_readers(timeout=5.0)
        state = self.live.snapshot()
        code, reason = self.verdict(state, returncode, note)
        for event in interrupted_applies(state):  # killed inside a window: said, not lost
            self._on_record(event)
        if self.store.error and self.store.lost:
            self._on_record(WarningEvent(source="store", message=(
                f"{self.store.lost} record(s) could not be stored ({self.store.error}); this report has them, "
                "the session folder does not")).event())
        self._stop_output()  # the script's last lines (a traceback) are in the state before it ends
        self.live.update(**finished_fields(code, reason))
        self.store.set_meta(finished=True, exit_code=code, exit_reason=reason)
        return code, reason

    def verdict(self, state: SessionState, returncode: int | None, note: str = "") -> tuple[int, str]:
        """The job's exit code and reason from ``state`` and the launched process's ``returncode``
        (no side effects: ``advisor/early_report.py`` asks it before the process has exited)."""
        launcher = read_launcher_exits(self.dir)
        code, reason = decide_exit(state, returncode, self.options.nproc_per_node, launcher,
                                   ranks=self.hosted_ranks() or None, before_stop=self._before_stop)
        with self._gone_lock:
            peers = list(self._peers_gone)
        lost = read_rendezvous_failure(self.dir) if self.multinode else None
        if peers and code != 0:  # the cause was on another node: name it first
            reason = f"{_peer_message(peers[0])}; here: {reason}"
        elif lost and code != 0:  # no verdict on a peer, but the launcher saw the other node go
            reason = f"{rendezvous_lost_reason(lost)}; here: {reason}"
        return code, stop_note(code, reason, note)

    def save_analysis(self, *, diagnosis: Any, recommendations: Any) -> None:
        self.store.set_meta(diagnosis=diagnosis, recommendations=recommendations)

    def _stop_output(self) -> None:
        if self.output is not None:
            self.output.stop()

    def close(self) -> None:
        if self._dead_rank_timer is not None:
            self._dead_rank_timer.cancel()
        self._stop_output()
        self.server.close()
        self.store.close()
        self._remove_secret()  # the secret is only needed while agents start


def finished_fields(code: int, reason: str) -> dict[str, Any]:
    """What ``Session.finish`` sets in the live state once the job has ended."""
    return {"finished": True, "exit_code": code, "exit_reason": reason, "pending_apply": None}


def allowed_plan_env(plan_env: Mapping[str, str]) -> dict[str, str]:
    """The variables a plan sets (``AgentSettings.plan_env``) that a plan may set (``env_refusal``)."""
    return {k: v for k, v in plan_env.items() if isinstance(k, str) and isinstance(v, str) and env_refusal(k, v) is None}


def merge_plan_env(env: Mapping[str, str], plan_env: Mapping[str, str]) -> dict[str, str]:
    """A plan's environment (``advisor.records.plan``) over the job's: the allocator's
    configuration is a comma-separated list of options, so the plan's options join the user's
    own (a plan's ``expandable_segments:True`` must not drop their ``max_split_size_mb``)."""
    out = dict(plan_env)
    key = "PYTORCH_CUDA_ALLOC_CONF"
    if key in out and env.get(key):
        mine = [o for o in env[key].split(",") if o]
        names = {o.split(":", 1)[0] for o in out[key].split(",") if o}
        out[key] = ",".join([o for o in mine if o.split(":", 1)[0] not in names] + [out[key]])
    return out


def _peer_message(event: Event) -> str:
    """What a ``peer_lost`` or ``peer_exit`` event says."""
    found = payload(event)
    return found.message if isinstance(found, (PeerLost, PeerExit)) else ""

