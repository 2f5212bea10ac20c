"""The control path: requests from a local client to a running controller.

Who uses it: ``advisor mcp --allow-apply`` (apply and revert on a live session) and an in-process
session (``advisor.session()``: its report, advice, apply and revert while the loop runs). The
controller's side is ``advisor/control_server.py``.

Owner-only and authenticated like the agents' channel, with the same frames
(``advisor.records.wire``: length, HMAC-SHA256, JSON; nothing is unpickled) and a secret of its
own (an agent cannot send control requests, a control client cannot pose as an agent):

- the controller listens on a Unix socket (0600) in a private temporary folder (0700), never on
  the network, and writes the socket's path and the control secret to ``control.json`` (0600) in
  the session folder (0700): whoever can read it is the session's owner;
- a connection starts with the controller's signed challenge ``{"type": "challenge", "nonce",
  "seq": 0}``, answered by ``{"type": "hello", "nonce", "seq": 0}`` within ``HELLO_TIMEOUT_S``;
- then ``{"type": "request", "seq", "op", "args"}``, answered by ``{"type": "response", "seq",
  "ok", "result"}`` or ``{..., "ok": false, "error"}``; each side's ``seq`` grows, so a frame
  replayed on its connection is refused, and on another it fails the handshake.

Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from advisor.records.wire import HELLO_MAX, MAX_FRAME, FrameReader, encode

CONTROL_FILE = "control.json"
REQUEST_MAX = 64 * 1024  # a request is a few names and flags; responses (a report) may be large
HELLO_TIMEOUT_S = 5.0


class ControlError(Exception):
    """The controller could not be reached, or refused the request (the message says why)."""


def write_control_file(session_dir: str | Path, socket_path: str, secret: bytes) -> Path:
    """``control.json`` in the session folder, created owner-only (0600) and replaced atomically."""
    target = Path(session_dir) / CONTROL_FILE
    tmp = target.with_name(f".{CONTROL_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"socket": socket_path, "secret": secret.hex(), "pid": os.getpid()}, handle)
    os.replace(tmp, target)
    return target


def read_control_file(session_dir: str | Path) -> tuple[str, bytes]:
    """(socket path, secret) of the session's live controller; ``ControlError`` when there is none."""
    path = Path(session_dir) / CONTROL_FILE
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read(4096))
        return str(data["socket"]), bytes.fromhex(str(data["secret"]))
    except FileNotFoundError:
        raise ControlError("the session has no running controller (it has ended, or was recorded by an advisor "
                           "without a control path)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ControlError(f"cannot read {path}: {exc}") from None


class ControlClient:
    """One authenticated connection to a session's controller."""

    def __init__(self, session_dir: str | Path, *, timeout: float = 60.0) -> None:
        path, self._secret = read_control_file(session_dir)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
        except OSError as exc:
            self._sock.close()
            raise ControlError(f"the session's controller does not answer ({exc.strerror or exc}): "
                               "the session has ended") from None
        self._reader = FrameReader(self._sock, self._secret, max_length=HELLO_MAX)
        self._sent = 0
        self._received = 0
        try:
            challenge = self._reader.read()
            if not challenge or challenge.get("type") != "challenge" or challenge.get("seq") != 0:
                raise ControlError("the controller did not send a valid challenge")
            self._sock.sendall(encode({"type": "hello", "nonce": challenge.get("nonce"), "seq": 0}, self._secret))
        except OSError as exc:
            self.close()
            raise ControlError(f"control handshake failed: {exc}") from None
        self._reader.max_length = MAX_FRAME

    def request(self, op: str, **args: Any) -> Any:
        """Send one request and wait for its answer; ``ControlError`` with the controller's reason."""
        self._sent += 1
        try:
            self._sock.sendall(encode({"type": "request", "seq": self._sent, "op": op, "args": args}, self._secret))
            answer = self._reader.read()
        except OSError as exc:
            raise ControlError(f"the controller stopped answering ({exc})") from None
        if answer is None:
            raise ControlError("the controller closed the connection (the session has ended)")
        seq = answer.get("seq")
        if answer.get("type") != "response" or not isinstance(seq, int) or seq <= self._received:
            raise ControlError("the controller's answer is out of sequence")
        self._received = seq
        if not answer.get("ok"):
            raise ControlError(str(answer.get("error") or "refused"))
        return answer.get("result")

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
