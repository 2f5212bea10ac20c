"""The agent's end of the channel: send records, receive commands, never block training.

``emit`` only appends to a bounded buffer (dropping, and counting drops, when it
is full) and wakes nothing. A daemon thread wakes every ``SEND_INTERVAL_S`` (50 ms, or at
``close``), encodes what accumulated and sends it over the Unix socket in one write;
another thread reads commands. Why not wake the sender on every record: its encoding
(JSON and HMAC) needs the GIL, and a sender woken at each step boundary takes it at the
training thread's next GIL release (inside the optimizer step, the autograd engine, the
next batch's ops), so every step paid a thread hand-off at a random place: measured on
2 cores, 0.5-9 ms inside ``Optimizer.step`` on a 7 ms step (issue 15's trace-vs-attach
gap). Batched, the hand-off happens at most 20 times a second whatever the step rate, each
round's records going out as one signed frame (``{"seq": LAST, "batch": [...]}``, up to
``BATCH_MESSAGES`` records, numbered up to LAST) with one ``json.dumps`` and one HMAC,
and a SIGKILLed training process still loses no more than the last 50 ms of records. When the controller is gone (never reachable, or the socket broke),
the sender appends the remaining records as JSON lines to a spill file in the
session folder, readable by its owner only, which ``advisor report`` merges
into the session store. A controller that dies (SIGKILL) takes with it what it had not read
from the socket or committed yet, which the sender had counted as sent: so the sender keeps what
it sent in the last ``RECENT_S`` seconds, with each frame's connection id (the controller's
challenge nonce) and sequence number, and spills that too once the socket breaks. The store
commits, with each record, the highest sequence number per connection it holds
(``received_seq``), and the reader skips spilled copies at or below it: nothing lost, nothing
counted twice. Training never waits on any of this, except for a
bounded flush at exit so the last records (the exit reason) get out.

``emit_record`` hands a record on as its message (``{"kind", "data"}``), or, for a record whose
fields no one changes after it is emitted (``encoded_later``: the step sample and the memory
probe's light sample, the records of every light step), as itself: the sender turns that into its
message, off the training thread (their ``to_dict``, run cold once a step, was part of the agent's
light-step cost).
"""

from __future__ import annotations

import collections
import json
import os
import socket
import threading
import time
from typing import Any, Callable

from advisor.records.samples import MemorySample, StepSample
from advisor.records.wire import FrameReader, WireError, encode

QUEUE_LIMIT = 50_000
CONNECT_TIMEOUT_S = 5.0  # one attempt's handshake
# A controller that refuses a connection (all its slots taken, its backlog full) or is not
# listening yet is tried again, waiting longer each time, for this long before the agent spills:
# a controller whose slots strangers held answered the next try (they time out in 5 s), and an
# agent that gave up at once reported nothing live ("steps 0").
RETRY_S = 20.0
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 1.0
SEND_INTERVAL_S = 0.05  # a SIGKILLed training process loses at most this much of its records
BATCH_MESSAGES = 2048  # records per frame at most (a deep step's records: about 1 MB a frame)
DRAIN_TIMEOUT_S = 2.0  # the longest a deep step's boundary waits for its records to be sent
RECENT_S = 5.0  # sent frames kept to spill again if the controller dies before storing them
RECENT_MAX = 4096


# Records sent at once rather than at the next round: how a process ended, and the events that
# come just before a launcher tears the job down (a lost peer's verdict, an OOM). A rank whose
# peer died can be killed by its launcher within the round's 50 ms, and the controller then knew
# nothing of why (seen on two localhost nodes: "exited with code 1 before its agent reported").
URGENT_EVENTS = frozenset({"peer_lost", "peer_exit", "oom"})


def _urgent(message: Any) -> bool:
    if type(message) is not dict:  # a record encoded later: a step or memory sample, never urgent
        return False
    kind = message.get("kind")
    return kind == "exit" or (kind == "event" and (message.get("data") or {}).get("name") in URGENT_EVENTS)


# Records built fresh at each emit, from containers no one changes after: a step sample (the
# outbox's, once a step) and a memory sample (the memory probe's light one, once a step; its
# categories a new dict each time, as the tracker's copies are).
_ENCODED_LATER = (StepSample, MemorySample)


def encoded_later(record: Any) -> bool:
    """Whether ``emit`` may take ``record`` itself, for the sender to encode (``_ENCODED_LATER``).
    Other records are encoded as they are emitted: some carry their caller's containers."""
    return type(record) in _ENCODED_LATER


def message_of(item: Any) -> dict[str, Any]:
    """The wire message of what ``emit`` took: a message as it is, a record as its kind and fields."""
    return item if type(item) is dict else {"kind": item.KIND, "data": item.to_dict()}


class Wake:
    """An event one thread waits on, cleared by the wait that sees it set: a bare lock held while
    unset, so ``wait`` is one C call. ``threading.Event.wait`` runs a ``Condition``'s Python code
    with a fresh lock per call, holding the interpreter lock the training thread needs between its
    ops, and the sender waits 20 times a second (its CPU a round beyond the records' encoding,
    the 20 ms MLP of bench/overhead.py under attach: 98 -> 76-83 us, most of it now the kernel's
    timed wait, outside the interpreter lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()  # any thread may release a plain lock
        except RuntimeError:
            pass  # set already, and not yet seen

    def wait(self, timeout: float) -> bool:
        """Wait until set (True, and unset again) or ``timeout`` seconds (False)."""
        return self._lock.acquire(timeout=timeout)


class AgentChannel:
    def __init__(
        self,
        socket_path: str | None,
        secret: bytes,
        *,
        spill_path: str | None,
        on_command: Callable[[dict[str, Any]], None] | None = None,
        rank: int = 0,
    ) -> None:
        self._rank = rank
        self._seq = 0  # numbers every frame sent after the hello (the controller refuses replays)
        self._socket_path = socket_path
        self._secret = secret
        self._spill_path = spill_path
        self._on_command = on_command
        # deque.append and popleft are atomic: the training thread never takes a lock here.
        self._pending: collections.deque = collections.deque()
        self._wake = Wake()
        self._rounds = 0  # the sender's completed rounds (``drain`` waits for one)
        self._round_done = threading.Condition()
        self._draining = 0  # threads in ``drain``: the sender notifies a round's end only then
        self._closing = False
        self._sock: socket.socket | None = None
        self._conn_id: str | None = None  # the controller's challenge nonce: names this connection
        self._recent: collections.deque = collections.deque(maxlen=RECENT_MAX)  # (time, seq, message) sent
        self._spill = None
        self.dropped = 0
        self.sent = 0
        self.writes = 0  # socket writes: one per batch, however many records it carries
        self.frames = 0  # signed frames sent: one per BATCH_MESSAGES records of a batch
        self.spilled = 0
        self.connected = False
        self._sender = threading.Thread(target=self._send_loop, name="advisor-agent-send", daemon=True)
        self._sender.start()

    # -- called from training threads -------------------------------------------------
    def emit_record(self, record: Any) -> None:
        """``emit`` of ``record``: as itself when ``encoded_later`` (the sender encodes it), else as
        its message, made now."""
        self.emit(record if encoded_later(record) else message_of(record))

    def emit(self, message: Any) -> None:
        """Buffer a message (or a record the sender encodes, see the module docstring) for the
        sender's next round; never blocks, never raises, and wakes the sender only for a record
        that a process about to die must not lose (``_urgent``)."""
        if len(self._pending) >= QUEUE_LIMIT:
            self.dropped += 1
            return
        self._pending.append(message)
        if _urgent(message):
            self._wake.set()

    def drain(self, timeout: float = DRAIN_TIMEOUT_S) -> bool:
        """Wait (at most ``timeout``) until the sender has sent everything buffered now; whether it did.

        Called at the boundary that ends a deep step, whose records (a thousand or more: memory
        samples, ops, modules) the sender would otherwise encode during the next step, holding the
        interpreter lock against the training thread in 5 ms turns: the light step after deep
        ones ran 10-40% slower than steady on the zoo's small jobs. Waiting here leaves the lock
        to the sender while the job is between steps; the boundary's own work is in no step's
        time. Never waits while no controller is connected: one still being connected to holds
        the sender in its retries (up to ``RETRY_S``), and a gone one is spilled to in the next round."""
        if not self._pending or self._closing or not self.connected:
            return True
        with self._round_done:
            done = self._rounds
            self._draining += 1
            self._wake.set()
            try:
                return self._round_done.wait_for(lambda: self._rounds > done and not self._pending, timeout)
            finally:
                self._draining -= 1

    def close(self, timeout: float = 5.0) -> None:
        """Send what is buffered (bounded by ``timeout``), then stop the sender."""
        self._closing = True
        self._wake.set()
        self._sender.join(timeout)
        if self._sock is not None:
            try:
                # shutdown, not just close: the reader thread's recv would keep the connection open.
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                self._sock.close()
            except OSError:
                pass

    # -- sender thread -----------------------------------------------------------------
    def _connect(self) -> None:
        if not self._socket_path:
            return
        deadline = time.monotonic() + RETRY_S
        delay = RETRY_FIRST_S
        while not self._closing and time.monotonic() < deadline:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self._socket_path)
                reader = self._handshake(sock)
            except (OSError, WireError):  # refused, or closed before its challenge: try again
                sock.close()
                self._wake.wait(delay)  # close() cuts the wait short: then spill at once
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            if reader is None:
                sock.close()
                return  # a controller that does not hold our secret: spill instead
            self._sock = sock
            self.connected = True
            threading.Thread(target=self._read_loop, args=(reader,), name="advisor-agent-recv", daemon=True).start()
            return

    def _handshake(self, sock: socket.socket) -> FrameReader | None:
        """Answer the controller's signed challenge with a signed hello carrying our rank; None when
        the challenge is not signed with our secret (``ConnectionRefusedError`` when the controller
        closed before sending one: it refused us, for now)."""
        sock.settimeout(CONNECT_TIMEOUT_S)
        reader = FrameReader(sock, self._secret)
        challenge = reader.read()
        if challenge is None and not reader.rejected:
            raise ConnectionRefusedError("the controller closed the connection before its challenge")
        if not challenge or challenge.get("type") != "challenge" or not isinstance(challenge.get("nonce"), str):
            return None
        sock.sendall(encode({"type": "hello", "nonce": challenge["nonce"], "rank": self._rank, "seq": 0},
                            self._secret))
        sock.settimeout(None)
        self._conn_id = challenge["nonce"]
        return reader

    def _send_loop(self) -> None:
        self._connect()
        while True:
            closing = self._closing  # read before draining: what was emitted before close() goes out
            self._send_batch()
            self._rounds += 1
            if self._draining:  # (a drain that starts after this reads the new count first)
                with self._round_done:
                    self._round_done.notify_all()
            if closing:
                break
            self._wake.wait(SEND_INTERVAL_S)  # a wake-up is used up by the wait that sees it
        if self._spill is not None:
            self._spill.close()

    def _send_batch(self) -> None:
        """Encode every buffered message and send them in one write (spill them if the controller is gone)."""
        batch = []
        while self._pending:
            try:
                batch.append(message_of(self._pending.popleft()))
            except Exception:  # a record that cannot say its fields: lost, counted, the rest go out
                self.dropped += 1
        if not batch:
            return
        if self.connected and self._sock is not None:
            frames, numbered = [], []
            for start in range(0, len(batch), BATCH_MESSAGES):
                self._frame(batch[start:start + BATCH_MESSAGES], frames, numbered)
            try:
                self._sock.sendall(b"".join(frames))
                self.writes += 1
                self.frames += len(frames)
                self._seq += len(numbered)
                self.sent += len(numbered)
                self._remember(numbered)
                return
            except OSError:
                self.connected = False  # controller gone: spill from now on
        self._spill_recent()  # gone (a failed write, or the reader saw it close): first what it may not have stored
        for message in batch:
            self._write_spill(message)

    def _frame(self, chunk: list[dict[str, Any]], frames: list[bytes],
               numbered: list[tuple[int, dict[str, Any]]]) -> None:
        """``chunk``'s messages as one signed frame, ``{"seq": LAST, "batch": [...]}`` (message i is
        number LAST - len + 1 + i), appended to ``frames``; one frame each, as before, when the batch
        cannot be encoded (a value JSON cannot hold, or over the frame limit), dropping only the
        messages that cannot. One ``json.dumps`` and one HMAC for a round's records, not one per
        record: a deep step's 60,000 records (5001 modules) cost the sender 0.27 s one by one."""
        first = self._seq + len(numbered) + 1
        if len(chunk) > 1:
            try:
                frames.append(encode({"seq": first + len(chunk) - 1, "batch": chunk}, self._secret))
                numbered.extend(zip(range(first, first + len(chunk)), chunk))
                return
            except (ValueError, TypeError):  # WireError is a ValueError
                pass
        for message in chunk:
            seq = self._seq + len(numbered) + 1
            try:
                frames.append(encode({**message, "seq": seq}, self._secret))
                numbered.append((seq, message))
            except (ValueError, TypeError):  # WireError is a ValueError
                self.dropped += 1

    def _remember(self, numbered: list[tuple[int, dict[str, Any]]]) -> None:
        now = time.monotonic()
        self._recent.extend((now, seq, message) for seq, message in numbered)
        while self._recent and self._recent[0][0] < now - RECENT_S:
            self._recent.popleft()

    def _spill_recent(self) -> None:
        """What was sent lately may never have been stored: spill it with its connection and
        sequence number, for the reader to skip what the store holds (see the module docstring)."""
        while self._recent:
            _, seq, message = self._recent.popleft()
            self._write_spill({**message, "conn": self._conn_id, "seq": seq})

    def _write_spill(self, message: dict[str, Any]) -> None:
        if not self._spill_path:
            self.dropped += 1
            return
        try:
            if self._spill is None:
                fd = os.open(self._spill_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                self._spill = os.fdopen(fd, "a", buffering=1)
            self._spill.write(json.dumps(message, allow_nan=False) + "\n")
            self.spilled += 1
        except (OSError, ValueError):
            self.dropped += 1

    # -- reader thread -----------------------------------------------------------------
    def _read_loop(self, reader: FrameReader) -> None:
        last_seq = 0
        while True:
            try:
                message = reader.read()
            except OSError:
                break
            if message is None:
                break
            seq = message.get("seq")
            if not isinstance(seq, int) or seq <= last_seq:
                continue  # a replayed command is never run twice
            last_seq = seq
            if self._on_command is not None and message.get("type") == "command":
                try:
                    self._on_command(message.get("command") or {})
                except Exception:  # a bad command must never kill the reader
                    pass
        self.connected = False
