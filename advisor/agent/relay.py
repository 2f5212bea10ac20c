"""Multi-node jobs, in the training process: one decider's commands reach every rank, and a lost
peer is noticed without waiting for the backend's timeout.

Why: each node has its own controller, reachable only by its own ranks over a local socket. Only
the controller that hosts global rank 0 decides. Its commands reach the other nodes over the
job's own process group: at every step boundary each rank calls ``CommandRelay.exchange``, where
rank 0 broadcasts the commands its controller sent since the last boundary as JSON bytes (one
int64 length, then, only when there is something, a uint8 tensor) over a gloo group of its own
(made at the first boundary, by every rank). Not the keep/revert agreement's gloo group: that one
times out after a minute, by design, and a rank that spends longer than that between boundaries
(rank 0 alone saving a checkpoint, an evaluation) would make the relay give up and stall its
peers; the relay's group waits as long as the job's own default group would (``timeout_s``,
torch's default 30 minutes), and a peer that is gone is found by the heartbeat. Every rank, rank 0 included, hands the decoded commands
to its executor at the same boundary, so an apply lands at the same step everywhere and the
keep/revert votes that follow pair up. Nothing received is unpickled: ``json.loads`` of at most
``MAX_PAYLOAD`` bytes, then the executor's own checks. Commands a non-deciding controller sends
are ignored here (and refused by that controller before, advisor/advice.py).

The first exchange also carries a random token from rank 0: every rank reports it
(``Event("job")``), so sessions of one run can be told from another run with the same id.

Lost peers: ``Heartbeat`` bumps a counter per rank in the job's key-value store (a new client
of the store the process group already uses: no listener is opened) every ``heartbeat_s``; the
agent of each node's first local rank watches every rank's counter and emits
``Event("peer_lost")`` for one that did not move for ``lost_after_s`` (ranks that finished say so
first). A failing rank waits (``settle``, bounded) for that verdict before it reports its exit, so
its node's report names the peer that went away rather than the error it caused here.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from advisor.apply.step_align import own_store_client
from advisor.probes.comm.intercept import advisor_internal
from advisor.records.settings import MultinodeSettings

MAX_PAYLOAD = 1 << 20  # bytes of JSON commands per boundary (a command is a few KiB)


class CommandRelay:
    """Rank 0's commands to every rank at each step boundary (see the module docstring)."""

    def __init__(self, *, rank: int, local_rank: int, world_size: int, settings: MultinodeSettings,
                 deliver: Callable[[dict[str, Any]], None], emit: Callable[[str, dict[str, Any]], None]) -> None:
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.timeout_s = settings.timeout_s
        self._group: Any = None  # made at the first exchange: a collective call, on every rank alike
        self._deliver = deliver
        self._emit = emit
        self._lock = threading.Lock()
        self._outbox: list[dict[str, Any]] = []
        self._token: str | None = None
        self.disabled = False
        self.heartbeat = Heartbeat(rank=rank, world_size=world_size, watch=local_rank == 0,
                                   every_s=settings.heartbeat_s, lost_after_s=settings.lost_after_s, emit=emit)
        self._ignored = False

    def submit(self, command: dict[str, Any]) -> None:
        """A command from this node's controller (socket thread): rank 0 relays it; others ignore it."""
        if self.rank != 0:
            if not self._ignored:
                self._ignored = True
                self._emit("warning", {"message": "a command from this node's controller was ignored: in a "
                                                  "multi-node job only the controller hosting rank 0 decides"})
            return
        with self._lock:
            self._outbox.append(dict(command))

    def exchange(self, step: int) -> None:
        """At the boundary starting ``step`` (every rank, training thread): deliver rank 0's commands."""
        if self.disabled or not (dist.is_available() and dist.is_initialized()):
            return
        try:
            with advisor_internal():
                commands, token = self._broadcast()
        except Exception as exc:  # a peer gone (gloo noticed), or the group timed out: stop relaying, never wait twice
            self.disabled = True
            self._emit("warning", {"message": f"multi-node command relay stopped at step {step}: "
                                              f"{type(exc).__name__}: {exc}"})
            return
        if token is not None and self._token is None:
            self._token = token
            self._emit("job", {"token": token, "world_size": self.world_size})
            self.heartbeat.start(token)
        for command in commands:
            if not isinstance(command, dict):
                continue
            rec = command.get("recommendation") if isinstance(command.get("recommendation"), dict) else {}
            self._emit("relayed_command", {"type": command.get("type"), "step": step, "from_rank": 0,
                                           "recommendation_id": rec.get("id"), "at_step": command.get("at_step")})
            try:
                self._deliver(command)
            except Exception as exc:  # malformed: refused the same way on every rank
                self._emit("warning", {"message": f"relayed command refused: {exc}"})

    def _broadcast(self) -> tuple[list[Any], str | None]:
        if self._group is None:
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout_s))
        group = self._group
        payload = b""
        if self.rank == 0:
            with self._lock:
                outbox, self._outbox = self._outbox, []
            body: dict[str, Any] = {"commands": outbox} if outbox else {}
            if self._token is None:
                body["token"] = secrets.token_hex(8)
            payload = json.dumps(body).encode() if body else b""
            if len(payload) > MAX_PAYLOAD:  # never seen in practice; drop rather than stall every rank
                self._emit("warning", {"message": f"{len(outbox)} command(s) too large to relay, dropped"})
                payload = b""
        size = torch.tensor([len(payload)], dtype=torch.int64)
        dist.broadcast(size, src=0, group=group)
        length = int(size.item())
        if length <= 0:
            return [], None
        if length > MAX_PAYLOAD:
            raise ValueError(f"relayed payload of {length} bytes exceeds {MAX_PAYLOAD}")
        if self.rank == 0:
            buffer = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            buffer = torch.empty(length, dtype=torch.uint8)
        dist.broadcast(buffer, src=0, group=group)
        body = json.loads(bytes(buffer.tolist()).decode("utf-8"))
        if not isinstance(body, dict):
            return [], None
        commands = body.get("commands") if isinstance(body.get("commands"), list) else []
        token = body.get("token") if isinstance(body.get("token"), str) else None
        return commands, token

    def close(self, code: int) -> None:
        """At exit: a failing rank first waits (bounded) for the verdict on its peers. Not one
        stopped on purpose (Ctrl-C: 130, SIGTERM from its launcher or controller: 143): the cause
        of that is known where the stop came from, and the launcher's kill timeout is running."""
        try:
            if code not in (0, 130, 143):
                self.heartbeat.settle()
        finally:  # even when a SIGTERM cuts the wait short: peers learn how this rank ended
            self.heartbeat.stop(code)


class Heartbeat:
    """Per-rank counters in the job's store; the watcher reports ranks whose counter stopped."""

    def __init__(self, *, rank: int, world_size: int, watch: bool, every_s: float, lost_after_s: float,
                 emit: Callable[[str, dict[str, Any]], None]) -> None:
        self.rank, self.world_size, self.watch = rank, world_size, watch
        self.every_s, self.lost_after_s = every_s, lost_after_s
        self._emit = emit
        self._store: Any = None
        self._prefix = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (counter, when it last moved)
        self._moves: dict[int, int] = {}  # rank -> how many times its counter was seen to move
        self.lost: set[int] = set()
        self.ended: dict[int, int] = {}  # rank -> exit code, for ranks that said they ended
        self.store_lost = False
        self._checked = threading.Condition()
        self._checks = 0

    def start(self, token: str) -> None:
        store = own_store_client()
        if store is None:
            return
        self._store, self._prefix = store, f"advisor/{token}/"
        self._thread = threading.Thread(target=self._loop, name="advisor-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._store.add(f"{self._prefix}hb/{self.rank}", 1)
                if self.watch:
                    self._check()
            except Exception as exc:  # noqa: BLE001 - the store's host is gone (or unreachable)
                # The store may live in rank 0's process (an outer launcher): when the job ends it goes
                # first. A rank that is itself ending stops within a beat or two: say nothing then.
                if not self._stop.wait(2 * self.every_s) and self.watch:
                    self.store_lost = True
                    self._emit("peer_lost", {"ranks": [], "message": "lost contact with the job's key-value "
                                             f"store ({type(exc).__name__}): the node hosting it may be gone"})
                self._notify()
                return
            self._notify()
            self._stop.wait(self.every_s)

    def _check(self) -> None:
        now = time.monotonic()
        newly = []
        for other in range(self.world_size):
            if other == self.rank or other in self.lost or other in self.ended:
                continue
            count = int(self._store.add(f"{self._prefix}hb/{other}", 0))
            last = self._seen.get(other)
            if last is None or count != last[0]:
                self._seen[other] = (count, now)
                # A new dict, not an update in place: settle() reads it from another thread.
                self._moves = {**self._moves, other: self._moves.get(other, 0) + 1}
                continue
            if now - last[1] < 2 * self.every_s:
                continue
            done = f"{self._prefix}done/{other}"
            if self._store.check([done]):  # it ended and said how: a failure is worth naming here
                code = _code(self._store.get(done))
                self.ended[other] = code
                if code:
                    self._emit("peer_exit", {"ranks": [other], "code": code, "message":
                                             f"rank {other} exited with code {code}"})
            elif now - last[1] >= self.lost_after_s:
                newly.append(other)
        if newly:
            self.lost.update(newly)
            silent = self.lost_after_s
            names = ", ".join(str(r) for r in newly)
            self._emit("peer_lost", {"ranks": newly, "silent_s": silent, "message":
                                     f"rank(s) {names} stopped responding (no heartbeat for {silent:g} s): "
                                     "their process or node is gone; ranks here may wait for them in a collective"})

    def _notify(self) -> None:
        with self._checked:
            self._checks += 1
            self._checked.notify_all()

    def settle(self) -> None:
        """Wait until every peer's counter was seen to move twice since now (once could be a beat
        sent just before it died), or one is found lost or failed (at most ``lost_after_s`` plus
        two beats)."""
        if not self.watch or self._thread is None or not self._thread.is_alive():
            return
        deadline = time.monotonic() + self.lost_after_s + 2 * self.every_s
        with self._checked:
            before = dict(self._moves)
            while time.monotonic() < deadline and not (self.lost or self.store_lost):
                if any(self.ended.values()):
                    return  # a peer failed and said so
                moves = dict(self._moves)
                peers = [r for r in range(self.world_size) if r != self.rank and r not in self.ended]
                if all(moves.get(r, 0) >= before.get(r, 0) + 2 for r in peers):
                    return
                self._checked.wait(self.every_s)

    def stop(self, code: int = 0) -> None:
        if self._store is not None:
            try:  # a rank that finished is not lost; its exit code is named on the other nodes
                self._store.set(f"{self._prefix}done/{self.rank}", str(code))
            except Exception:  # noqa: BLE001 - the store may be gone already
                pass
        self._stop.set()


def _code(value: Any) -> int:
    try:
        return int(bytes(value).decode())
    except (TypeError, ValueError):
        return 1
