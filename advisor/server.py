"""The controller's end of the channel: a Unix socket only its owner can reach.

Each agent connects once and authenticates (``advisor.records.wire``: a signed
hello answering the controller's challenge, with its rank); every frame is then
checked against the session secret and its sequence number, so a process that
can reach the socket but does not hold the secret gets nothing in: its frames
are dropped and counted, never parsed into records, never unpickled. The
number of connections is capped, an unauthenticated connection may send only
small frames and only for ``HELLO_TIMEOUT_S``, and commands go only to
authenticated agents. ``HELLO_TIMEOUT_S`` bounds the handshake as a whole, not each read: a
stranger trickling a valid hello a byte at a time is closed when it runs out.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
from typing import Any, Callable

from advisor.intake import RecordError, parse_record
from advisor.priority import lower_priority
from advisor.records.samples import Record
from advisor.records.wire import HELLO_MAX, MAX_FRAME, FrameReader, encode

log = logging.getLogger("advisor.server")

MAX_CONNECTIONS = 256  # ranks on one node, with room; beyond this a connection is closed at once
HELLO_TIMEOUT_S = 5.0
SOCKET_PREFIX = "advisor-"


class _Peer:
    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.rank: int | None = None  # set once authenticated
        self.conn_id: str | None = None  # the challenge's nonce: the agent spills under this name
        self.sent_seq = 0
        self.send_lock = threading.Lock()
        self.done = threading.Event()


class ChannelServer:
    def __init__(self, secret: bytes, on_record: Callable[[Record], None], *,
                 on_hello: Callable[[int], None] | None = None,
                 on_disconnect: Callable[[int], None] | None = None, max_connections: int = MAX_CONNECTIONS,
                 with_origin: bool = False) -> None:
        self._secret = secret
        self._on_record = on_record
        # on_record(record, (connection id, seq)): the store commits the highest seq with the record,
        # so a spilled copy of a frame it holds is skipped (advisor/agent/channel.py).
        self._with_origin = with_origin
        self._on_hello = on_hello
        self._on_disconnect = on_disconnect
        self._max_connections = max_connections
        self._dir, self.path, self._sock = listen_privately("agent.sock", backlog=64)
        self._peers: list[_Peer] = []
        self._lock = threading.Lock()
        self.rejected = 0
        self.last_rejection = ""
        self.ranks: set[int] = set()
        self.received = 0  # records accepted
        self._closed = False
        threading.Thread(target=self._accept_loop, name="advisor-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        accept_connections(self._sock, closed=lambda: self._closed, admit=self._admit, serve=self._serve,
                           name="advisor-recv")

    def _admit(self, conn: socket.socket) -> _Peer | None:
        with self._lock:
            if len(self._peers) >= self._max_connections:
                full = True
            else:
                full, peer = False, _Peer(conn)
                self._peers.append(peer)
        if full:
            self._reject(f"connection refused: {self._max_connections} connections already open")
            return None
        return peer

    def _serve(self, peer: _Peer) -> None:
        reader = FrameReader(peer.conn, self._secret, max_length=HELLO_MAX)
        try:
            if self._handshake(peer, reader):
                reader.max_length = MAX_FRAME
                # After the handshake (a rank waits on it at start-up): the records' intake, a
                # deep step's thousands at a time, never ahead of the job on a shared core.
                lower_priority()
                self._read_records(peer, reader)
        finally:
            if reader.rejected:
                self._reject(f"dropped {reader.rejected} frame(s): {reader.last_error}", count=reader.rejected)
            with self._lock:
                if peer in self._peers:
                    self._peers.remove(peer)
            peer.conn.close()
            peer.done.set()
            if peer.rank is not None and self._on_disconnect is not None and not self._closed:
                try:
                    self._on_disconnect(peer.rank)
                except Exception:  # noqa: BLE001 - a callback must not kill the reader
                    log.exception("on_disconnect failed")

    def _handshake(self, peer: _Peer, reader: FrameReader) -> bool:
        nonce = secrets.token_hex(16)
        reader.deadline = time.monotonic() + HELLO_TIMEOUT_S  # for the whole handshake, however it trickles
        try:
            peer.conn.settimeout(HELLO_TIMEOUT_S)  # a peer that stalls mid-frame is dropped, not waited on
            peer.conn.sendall(encode({"type": "challenge", "nonce": nonce, "seq": 0}, self._secret))
            hello = reader.read()
        except OSError:
            hello = None
        reader.deadline = None
        rank = hello.get("rank") if hello else None
        if (not hello or hello.get("type") != "hello" or hello.get("nonce") != nonce or hello.get("seq") != 0
                or not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < 1 << 20):
            if hello is not None:
                self._reject("connection without a valid hello closed")
            return False
        peer.conn.settimeout(None)
        peer.rank = rank
        peer.conn_id = nonce
        with self._lock:
            self.ranks.add(rank)
        if self._on_hello is not None:
            try:
                self._on_hello(rank)
            except Exception:  # noqa: BLE001 - a callback must not cost the connection
                log.exception("on_hello failed")
        return True

    def _read_records(self, peer: _Peer, reader: FrameReader) -> None:
        last_seq = 0
        while True:
            try:
                message = reader.read()
            except OSError:
                return
            if message is None:
                return
            seq = message.get("seq")
            batch = message.get("batch")
            count = len(batch) if type(batch) is list else 1  # a batch's messages are numbered up to its seq
            if not isinstance(seq, int) or isinstance(seq, bool) or seq - count + 1 <= last_seq or count == 0:
                self._reject(f"frame out of sequence ({str(seq)[:20]} after {last_seq}): a replay, dropped")
                continue
            last_seq = seq
            if type(batch) is not list:
                self._dispatch(message, (peer.conn_id, seq))
                continue
            for number, item in enumerate(batch, start=seq - count + 1):
                if type(item) is dict:
                    self._dispatch(item, (peer.conn_id, number))
                else:
                    self._reject("malformed record dropped: a batch item is not an object")

    def _dispatch(self, message: dict[str, Any], origin: tuple[str | None, int]) -> None:
        try:
            record = parse_record(message.get("kind"), message.get("data"))
        except RecordError as exc:
            self._reject(f"malformed record dropped: {exc}")
            return
        self.received += 1
        try:
            if self._with_origin:
                self._on_record(record, origin)
            else:
                self._on_record(record)
        except Exception as exc:  # noqa: BLE001 - one record must never stop the receiver
            self._reject(f"record could not be recorded: {type(exc).__name__}: {exc}")

    def _reject(self, why: str, count: int = 1) -> None:
        with self._lock:
            self.rejected += count
            self.last_rejection = why[:300]
        log.warning("%s", why[:300])

    @property
    def connections(self) -> int:
        """Authenticated agents connected now."""
        with self._lock:
            return sum(1 for p in self._peers if p.rank is not None)

    def broadcast(self, command: dict[str, Any]) -> int:
        """Send a command to every authenticated agent; returns how many received it."""
        with self._lock:
            peers = [p for p in self._peers if p.rank is not None]
        sent = 0
        for peer in peers:
            with peer.send_lock:
                peer.sent_seq += 1
                frame = encode({"type": "command", "command": command, "seq": peer.sent_seq}, self._secret)
                try:
                    peer.conn.sendall(frame)
                    sent += 1
                except OSError:
                    pass
        return sent

    def wait_readers(self, timeout: float, *, limit: float = 120.0) -> None:
        """Wait until every authenticated agent has closed its connection (its last records are in).

        Gives up after ``timeout`` seconds without a new record (a stalled peer), or ``limit`` in all;
        connections that never authenticated are not waited for, and are closed."""
        started = time.monotonic()
        last_count, last_progress = self.received, started
        while True:
            with self._lock:
                waiting = [p for p in self._peers if p.rank is not None and not p.done.is_set()]
                strangers = [p for p in self._peers if p.rank is None]
            for peer in strangers:
                try:
                    peer.conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            now = time.monotonic()
            if self.received != last_count:  # still draining: a loaded machine is slow, not stuck
                last_count, last_progress = self.received, now
            if not waiting or now - last_progress >= timeout or now - started >= limit:
                return
            waiting[0].done.wait(min(0.2, timeout))

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        finally:
            with self._lock:
                peers = list(self._peers)
            for peer in peers:
                try:
                    peer.conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            for path in (self.path, self._dir):
                try:
                    (os.unlink if path == self.path else os.rmdir)(path)
                except OSError:
                    pass


def listen_privately(name: str, *, backlog: int, prefix: str = SOCKET_PREFIX) -> tuple[str, str, socket.socket]:
    """(folder, path, listening socket): a Unix socket ``name`` (0600) in a fresh private temporary
    folder (0700), after sweeping the stale ones a killed controller left. The temporary folder, not
    the session folder: AF_UNIX paths are limited to about 107 bytes."""
    sweep_stale_sockets(name=name)
    folder = tempfile.mkdtemp(prefix=prefix)
    os.chmod(folder, 0o700)
    path = os.path.join(folder, name)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    return folder, path, sock


def accept_connections(sock: socket.socket, *, closed: Callable[[], bool], admit: Callable[[socket.socket], Any],
                       serve: Callable[[Any], None], name: str) -> None:
    """Accept until ``closed()`` or the socket closes: ``admit(conn)`` returns what ``serve`` gets, on
    a daemon thread of its own, or None to refuse (the connection is closed at once)."""
    while not closed():
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        admitted = admit(conn)
        if admitted is None:
            conn.close()
            continue
        threading.Thread(target=serve, args=(admitted,), name=name, daemon=True).start()


def sweep_stale_sockets(*, name: str = "agent.sock") -> int:
    """Remove socket folders that controllers killed earlier left behind (this user's, holding only
    a socket called ``name``, with no listener); returns how many were removed."""
    removed = 0
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), SOCKET_PREFIX + "*")):
        path = os.path.join(folder, name)
        try:
            if os.lstat(folder).st_uid != os.getuid() or os.listdir(folder) != [name]:
                continue
            if time.time() - os.lstat(path).st_mtime < 60:
                continue  # perhaps a controller between bind() and listen()
        except OSError:
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            continue  # a live controller
        except OSError as exc:
            if exc.errno != errno.ECONNREFUSED:
                continue
        finally:
            probe.close()
        try:
            os.unlink(path)
            os.rmdir(folder)
            removed += 1
        except OSError:
            pass
    return removed
