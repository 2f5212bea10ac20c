"""The controller's end of the control path (advisor/records/control.py): report, advice, apply
and revert for local clients that hold the session's control secret.

Run by every live controller (``advisor attach`` and an in-process session's, advisor/hosted.py)
beside the agents' channel. The requests go through the same objects the TUI uses: the
``AdviceLoop``'s ``apply`` and ``revert`` (and so the same refusals: one apply at a time, no
restart remedy on a running job, a live-opt-in remedy only with the user's consent, only the
deciding controller of a multi-node job) and ``build_report`` on the live state. A connection
that does not authenticate within ``HELLO_TIMEOUT_S`` is closed; at most ``MAX_CLIENTS`` are
served at once; requests are at most ``REQUEST_MAX`` bytes; nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from advisor.records.control import CONTROL_FILE, HELLO_TIMEOUT_S, REQUEST_MAX, write_control_file
from advisor.records.wire import HELLO_MAX, FrameReader, WireError, encode, new_secret
from advisor.regime import last_kept
from advisor.report import build_report
from advisor.server import SOCKET_PREFIX, accept_connections, listen_privately

log = logging.getLogger("advisor.control")

MAX_CLIENTS = 8
CONTROL_SOCKET = "control.sock"
ADVICE_WAIT_S = 10.0  # how long a request for advice waits for the records already in to be advised on
CATCH_UP_S = 10.0  # how long it waits for the step the client has seen (``until_step``) to arrive

Handler = Callable[[str, dict[str, Any]], Any]


class RequestError(Exception):
    """A request the controller refuses: the message goes back to the client."""


def _plain(value: Any) -> Any:
    """A state record in its JSON form (the report's shape): typed records by their ``to_dict``,
    other dataclasses field by field, lists item by item; plain values as they are."""
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


class ControlOps:
    """What a control request can do to a live session (``Session`` and ``AdviceLoop``)."""

    def __init__(self, session: Any, advice: Any, *, budget_bytes: int | None) -> None:
        self.session, self.advice, self.budget_bytes = session, advice, budget_bytes

    def __call__(self, op: str, args: dict[str, Any]) -> Any:
        method = getattr(self, f"op_{op}", None) if op.isidentifier() else None
        if method is None:
            raise RequestError(f"unknown request {op!r}")
        return method(args)

    def _catch_up(self, args: dict[str, Any]) -> None:
        """Advice as of the client's ``until_step``: an in-process session asks from inside its
        loop, whose records (sent every 50 ms) may not be here yet. Wait for that step to arrive,
        then for the advice loop to have seen everything that arrived."""
        until = args.get("until_step")
        if isinstance(until, int) and not isinstance(until, bool):
            live, deadline, seen = self.session.live, time.monotonic() + CATCH_UP_S, -1
            while time.monotonic() < deadline:
                if live.version != seen:
                    seen = live.version
                    state = live.snapshot()
                    if state.finished or state.latest_step() >= until:
                        break
                time.sleep(0.01)
        self.advice.wait_idle(ADVICE_WAIT_S)

    def op_status(self, args: dict[str, Any]) -> dict[str, Any]:
        state = self.session.live.snapshot()
        return {"session_id": self.session.id, "path": str(self.session.dir), "latest_step": state.latest_step(),
                "finished": state.finished, "pending_apply": _plain(state.pending_apply),
                "applied": _plain(state.applied)}

    def op_advice(self, args: dict[str, Any]) -> dict[str, Any]:
        self._catch_up(args)
        state = self.session.live.snapshot()
        return {"diagnosis": _plain(state.diagnosis), "recommendations": _plain(state.recommendations),
                "latest_step": state.latest_step()}

    def op_report(self, args: dict[str, Any]) -> dict[str, Any]:
        self._catch_up(args)
        budget = args.get("budget_bytes")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0):
            raise RequestError("budget_bytes must be a whole number of bytes above 0")
        return build_report(self.session.live.snapshot(), budget_bytes=budget or self.budget_bytes)

    def op_apply(self, args: dict[str, Any]) -> dict[str, Any]:
        rec_id, confirm = args.get("recommendation_id"), args.get("confirm", False)
        if not isinstance(rec_id, str) or not isinstance(confirm, bool):
            raise RequestError("apply needs recommendation_id (a string) and confirm (true or false)")
        self._catch_up(args)  # the boundary it lands at is counted from the latest step seen
        recs = _plain(self.session.live.snapshot().recommendations)
        rec = next((r for r in recs if r.get("id") == rec_id), None)
        refusal = self.advice.apply(rec_id, confirmed=confirm)
        if refusal:
            if rec is not None and rec.get("apply_class") == "live-opt-in" and not confirm:
                refusal += ("; it changes the training's numerics: apply it only with the user's explicit "
                            "consent, by asking again with confirm=true")
            raise RequestError(refusal)
        pending = _plain(self.session.live.snapshot().pending_apply) or {}
        return {"recommendation_id": rec_id, "at_step": pending.get("at_step"),
                "apply_class": (rec or {}).get("apply_class")}

    def op_revert(self, args: dict[str, Any]) -> dict[str, Any]:
        rec_id = args.get("recommendation_id")
        self._catch_up(args)
        kept = _plain(last_kept(self.session.live.snapshot().applied))
        if rec_id is not None and kept is not None and kept.get("recommendation_id") != rec_id:
            raise RequestError(f"{rec_id!r} is not the remedy in force (that is {kept.get('recommendation_id')!r}): "
                               "remedies are reverted last applied first")
        refusal = self.advice.revert()
        if refusal:
            raise RequestError(refusal)
        return {"recommendation_id": (kept or {}).get("recommendation_id")}


class ControlServer:
    """A Unix socket only the session's owner can reach, serving ``handler(op, args)``."""

    def __init__(self, session_dir: str | Path, handler: Handler) -> None:
        self._handler = handler
        self._session_dir = Path(session_dir)
        self._secret = new_secret()
        self._dir, self.path, self._sock = listen_privately(CONTROL_SOCKET, backlog=MAX_CLIENTS,
                                                            prefix=SOCKET_PREFIX + "control-")
        self._clients = 0
        self._lock = threading.Lock()
        self._closed = False
        self.rejected = 0
        write_control_file(self._session_dir, self.path, self._secret)
        threading.Thread(target=self._accept_loop, name="advisor-control", daemon=True).start()

    def _accept_loop(self) -> None:
        accept_connections(self._sock, closed=lambda: self._closed, admit=self._admit, serve=self._serve,
                           name="advisor-control-client")

    def _admit(self, conn: socket.socket) -> socket.socket | None:
        with self._lock:
            if self._clients >= MAX_CLIENTS:
                self.rejected += 1
                return None
            self._clients += 1
        return conn

    def _serve(self, conn: socket.socket) -> None:
        try:
            reader = FrameReader(conn, self._secret, max_length=HELLO_MAX)
            if self._handshake(conn, reader):
                reader.max_length = REQUEST_MAX
                self._answer(conn, reader)
        except (OSError, WireError, TimeoutError):
            pass
        finally:
            with self._lock:
                self._clients -= 1
            conn.close()

    def _handshake(self, conn: socket.socket, reader: FrameReader) -> bool:
        nonce = secrets.token_hex(16)
        reader.deadline = time.monotonic() + HELLO_TIMEOUT_S  # the whole handshake, however it trickles
        conn.sendall(encode({"type": "challenge", "nonce": nonce, "seq": 0}, self._secret))
        try:
            hello = reader.read()
        except OSError:  # the deadline passed (TimeoutError), or the peer went away
            hello = None
        reader.deadline = None
        conn.settimeout(None)
        ok = bool(hello) and hello.get("type") == "hello" and hello.get("nonce") == nonce and hello.get("seq") == 0
        if not ok:
            self.rejected += 1
        return ok

    def _answer(self, conn: socket.socket, reader: FrameReader) -> None:
        last, sent = 0, 0
        while not self._closed:
            message = reader.read()
            if message is None:
                return
            seq = message.get("seq")
            if not isinstance(seq, int) or isinstance(seq, bool) or seq <= last or message.get("type") != "request":
                self.rejected += 1
                return  # a replay or a confused client: this connection is done
            last = seq
            op, args = message.get("op"), message.get("args")
            sent += 1
            try:
                if not isinstance(op, str) or not isinstance(args, dict):
                    raise RequestError("a request needs op (a string) and args (an object)")
                frame = encode({"type": "response", "seq": sent, "ok": True, "result": self._handler(op, args)},
                               self._secret)
            except RequestError as exc:
                frame = encode({"type": "response", "seq": sent, "ok": False, "error": str(exc)}, self._secret)
            except Exception as exc:  # noqa: BLE001 - a failing request must not take the controller down
                log.exception("control request %r failed", op)
                frame = encode({"type": "response", "seq": sent, "ok": False,
                                "error": f"{type(exc).__name__}: {exc}"[:2000]}, self._secret)
            conn.sendall(frame)

    def close(self) -> None:
        """Stop serving, and remove the socket and ``control.json``: the session is no longer live."""
        self._closed = True
        try:
            (self._session_dir / CONTROL_FILE).unlink()
        except OSError:
            pass
        try:
            self._sock.close()
        finally:
            for path in (self.path, self._dir):
                try:
                    (os.unlink if path == self.path else os.rmdir)(path)
                except OSError:
                    pass
