"""The agent's end of the channel: send records, receive commands, never block training.

``emit`` only appends to a bounded queue (dropping, and counting drops, when it
is full). A daemon thread sends frames over the Unix socket; another reads
commands. When the controller is gone (never reachable, or the socket broke),
the sender appends the remaining records as JSON lines to a spill file in the
session folder, readable by its owner only, which ``advisor report`` merges
into the session store. Training never waits on any of this, except for a
bounded flush at exit so the last records (the exit reason) get out.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
from typing import Any, Callable

from advisor.records.wire import FrameReader, WireError, encode

_STOP = object()
QUEUE_LIMIT = 50_000
CONNECT_TIMEOUT_S = 5.0


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
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_LIMIT)
        self._sock: socket.socket | None = None
        self._spill = None
        self.dropped = 0
        self.sent = 0
        self.spilled = 0
        self.connected = False
        self._sender = threading.Thread(target=self._send_loop, name="advisor-agent-send", daemon=True)
        self._sender.start()

    # -- called from training threads -------------------------------------------------
    def emit(self, message: dict[str, Any]) -> None:
        """Queue a message; never blocks, never raises."""
        try:
            self._queue.put_nowait(message)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued (bounded by ``timeout``), then stop the sender."""
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass
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
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while time.monotonic() < deadline:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self._socket_path)
                reader = self._handshake(sock)
            except (OSError, WireError):
                sock.close()
                time.sleep(0.05)
                continue
            if reader is None:
                sock.close()
                return  # a controller that does not hold our secret: spill instead
            self._sock = sock
            self.connected = True
            threading.Thread(target=self._read_loop, args=(reader,), name="advisor-agent-recv", daemon=True).start()
            return

    def _handshake(self, sock: socket.socket) -> FrameReader | None:
        """Answer the controller's signed challenge with a signed hello carrying our rank."""
        sock.settimeout(CONNECT_TIMEOUT_S)
        reader = FrameReader(sock, self._secret)
        challenge = reader.read()
        if not challenge or challenge.get("type") != "challenge" or not isinstance(challenge.get("nonce"), str):
            return None
        sock.sendall(encode({"type": "hello", "nonce": challenge["nonce"], "rank": self._rank, "seq": 0},
                            self._secret))
        sock.settimeout(None)
        return reader

    def _send_loop(self) -> None:
        self._connect()
        while True:
            message = self._queue.get()
            if message is _STOP:
                break
            if self.connected and self._sock is not None:
                try:
                    frame = encode({**message, "seq": self._seq + 1}, self._secret)
                    self._sock.sendall(frame)
                    self._seq += 1
                    self.sent += 1
                    continue
                except WireError:
                    self.dropped += 1
                    continue
                except OSError:
                    self.connected = False  # controller gone: spill from now on
            self._write_spill(message)
        if self._spill is not None:
            self._spill.close()

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
