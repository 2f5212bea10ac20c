"""The controller's end of the channel: a Unix socket only its owner can reach.

Each agent connects once; every frame is checked against the session secret
(``advisor.records.wire``), so a process that can reach the socket but does not hold
the secret gets nothing in: its frames are dropped and counted, never parsed
into records, never unpickled.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
from typing import Any, Callable

from advisor.intake import RecordError, parse_record
from advisor.records.samples import Record
from advisor.records.wire import FrameReader, encode

log = logging.getLogger("advisor.server")


class ChannelServer:
    def __init__(self, secret: bytes, on_record: Callable[[Record], None]) -> None:
        self._secret = secret
        self._on_record = on_record
        self._dir = tempfile.mkdtemp(prefix="advisor-")  # short path: AF_UNIX paths are limited to ~107 bytes
        os.chmod(self._dir, 0o700)
        self.path = os.path.join(self._dir, "agent.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o600)
        self._sock.listen(64)
        self._conns: list[socket.socket] = []
        self._readers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.rejected = 0
        self.last_rejection = ""
        self._closed = False
        threading.Thread(target=self._accept_loop, name="advisor-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            reader = threading.Thread(target=self._read_loop, args=(conn,), name="advisor-recv", daemon=True)
            self._readers.append(reader)
            reader.start()

    def _read_loop(self, conn: socket.socket) -> None:
        reader = FrameReader(conn, self._secret)
        try:
            while True:
                try:
                    message = reader.read()
                except OSError:
                    break
                if message is None:
                    break
                self._dispatch(message)
        finally:
            if reader.rejected:
                self.rejected += reader.rejected
                self.last_rejection = reader.last_error
                log.warning("dropped %d frame(s): %s", reader.rejected, reader.last_error)
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            conn.close()

    def _dispatch(self, message: dict[str, Any]) -> None:
        try:
            record = parse_record(message.get("kind"), message.get("data"))
        except RecordError as exc:
            self._reject(f"malformed record dropped: {exc}")
            return
        try:
            self._on_record(record)
        except Exception as exc:  # noqa: BLE001 - one record must never stop the receiver
            self._reject(f"record could not be recorded: {type(exc).__name__}: {exc}")

    def _reject(self, why: str) -> None:
        with self._lock:
            self.rejected += 1
            self.last_rejection = why[:300]
        log.warning("%s", why[:300])

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def broadcast(self, command: dict[str, Any]) -> int:
        """Send a command to every connected agent; returns how many received it."""
        frame = encode({"type": "command", "command": command}, self._secret)
        sent = 0
        with self._lock:
            for conn in list(self._conns):
                try:
                    conn.sendall(frame)
                    sent += 1
                except OSError:
                    pass
        return sent

    def wait_readers(self, timeout: float) -> None:
        """Wait until every agent has closed its connection (its last records are in)."""
        for reader in list(self._readers):
            reader.join(timeout)

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        finally:
            for path in (self.path, self._dir):
                try:
                    (os.unlink if path == self.path else os.rmdir)(path)
                except OSError:
                    pass
