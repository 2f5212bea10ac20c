"""The message format between the agents and the controller.

A frame is ``length (4 bytes, big endian) | HMAC-SHA256 (32 bytes) | JSON``,
where the HMAC is computed over the JSON bytes with the per-session secret.
A frame that fails the HMAC, exceeds ``MAX_FRAME`` or is not a JSON object is
rejected with ``WireError``: the reader drops it and carries on.

A connection starts with a handshake: the controller sends a signed challenge
(a fresh nonce); the agent answers with a signed hello carrying that nonce and
its rank. Until then frames are limited to ``HELLO_MAX`` bytes, so nothing large
is buffered for a peer that does not hold the secret. Every later frame, both
ways, carries a ``seq`` number that must grow: a captured frame replayed on the
same connection is refused, and on another connection it fails the handshake. An agent's
frame may carry a batch of records (``{"seq": LAST, "batch": [...]}``): they are numbered up to
LAST, and the first of them must come after the last number seen. Nothing is
ever unpickled. Standard library only: the controller imports this module
without torch.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import time
from typing import Any

MAX_FRAME = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")
_MAC_LEN = 32

HELLO_MAX = 4096  # the largest frame a connection may send before its signed hello

SECRET_ENV = "ADVISOR_SECRET_FILE"
SOCKET_ENV = "ADVISOR_SOCKET"


class WireError(ValueError):
    """A frame that must be dropped: bad length, bad HMAC, or not a JSON object."""


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def encode(message: dict[str, Any], secret: bytes) -> bytes:
    """Serialise one message into a signed frame."""
    payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(payload) + _MAC_LEN > MAX_FRAME:
        raise WireError(f"message of {len(payload)} bytes exceeds the {MAX_FRAME}-byte frame limit")
    mac = hmac.new(secret, payload, hashlib.sha256).digest()
    return _HEADER.pack(len(payload) + _MAC_LEN) + mac + payload


def decode(body: bytes, secret: bytes) -> dict[str, Any]:
    """Check and parse a frame body (everything after the length)."""
    if len(body) < _MAC_LEN:
        raise WireError("frame shorter than its HMAC")
    mac, payload = body[:_MAC_LEN], body[_MAC_LEN:]
    expected = hmac.new(secret, payload, hashlib.sha256).digest()
    if not hmac.compare_digest(mac, expected):
        raise WireError("frame HMAC does not match the session secret")
    try:
        message = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # deep nesting too
        raise WireError(f"frame is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise WireError("frame is not a JSON object")
    return message


class FrameReader:
    """Incremental reader of frames from a stream socket.

    ``read()`` returns the next good message, skips bad ones (counting them in
    ``rejected``) and returns None at end of stream. A frame whose length is
    out of bounds means the stream is desynchronised: the reader stops.
    """

    def __init__(self, sock: socket.socket, secret: bytes, *, max_length: int = MAX_FRAME) -> None:
        self._sock = sock
        self._secret = secret
        self.max_length = max_length  # small until the peer has authenticated: nothing large is buffered
        # time.monotonic() by which reading must be done (the handshake as a whole): a socket
        # timeout bounds one recv(), so a peer trickling a byte every few seconds never hit it.
        self.deadline: float | None = None
        self.rejected = 0
        self.last_error = ""

    def _read_exact(self, n: int) -> bytes | None:
        chunks = []
        while n:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the peer did not finish in time")
                self._sock.settimeout(left)
            chunk = self._sock.recv(min(n, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def read(self) -> dict[str, Any] | None:
        while True:
            header = self._read_exact(_HEADER.size)
            if header is None:
                return None
            (length,) = _HEADER.unpack(header)
            if length < _MAC_LEN or length > self.max_length:
                self.rejected += 1
                self.last_error = f"frame length {length} out of bounds"
                return None
            body = self._read_exact(length)
            if body is None:
                return None
            try:
                return decode(body, self._secret)
            except WireError as exc:
                self.rejected += 1
                self.last_error = str(exc)


def write_secret_file(path: str, secret: bytes) -> None:
    """Write the secret readable by its owner only (created 0600, never widened)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(secret.hex().encode())


def read_secret_file(path: str) -> bytes:
    with open(path, "rb") as handle:
        return bytes.fromhex(handle.read().decode().strip())
