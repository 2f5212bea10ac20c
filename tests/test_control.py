"""The control path (advisor/records/control.py, advisor/control_server.py): local, owner-only,
authenticated, replay-proof, nothing unpickled; and its requests obey the TUI's consent rules."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from recommendations import recommendation

from advisor.advice import AdviceLoop
from advisor.control_server import ControlOps, ControlServer, RequestError
from advisor.records.control import CONTROL_FILE, ControlClient, ControlError, read_control_file
from advisor.records.settings import AgentSettings
from advisor.records.wire import FrameReader, encode
from advisor.state import LiveState


@pytest.fixture
def server(tmp_path: Path):
    folder = tmp_path / "session"
    folder.mkdir(mode=0o700)
    calls: list[tuple[str, dict]] = []

    def handler(op: str, args: dict) -> object:
        calls.append((op, args))
        if op == "fail":
            raise RequestError("refused, with a reason")
        return {"op": op, "args": args}

    control = ControlServer(folder, handler)
    yield SimpleNamespace(folder=folder, control=control, calls=calls)
    control.close()


def test_a_request_is_answered_and_the_files_are_owner_only(server) -> None:
    with ControlClient(server.folder) as client:
        assert client.request("status", x=1) == {"op": "status", "args": {"x": 1}}
        with pytest.raises(ControlError, match="refused, with a reason"):
            client.request("fail")
        assert client.request("again") == {"op": "again", "args": {}}  # the connection serves on
    file_mode = stat.S_IMODE(os.stat(server.folder / CONTROL_FILE).st_mode)
    path, _ = read_control_file(server.folder)
    assert file_mode == 0o600
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    server.control.close()
    assert not (server.folder / CONTROL_FILE).exists() and not os.path.exists(path)
    with pytest.raises(ControlError, match="no running controller"):
        ControlClient(server.folder)


def test_a_client_without_the_secret_gets_nothing_done(server, tmp_path: Path) -> None:
    data = json.loads((server.folder / CONTROL_FILE).read_text())
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / CONTROL_FILE).write_text(json.dumps({**data, "secret": "00" * 32}))
    with pytest.raises(ControlError):
        ControlClient(forged, timeout=10).request("status")
    assert server.calls == []  # the handler never ran
    assert server.control.rejected >= 1


def test_a_replayed_request_is_refused(server) -> None:
    path, secret = read_control_file(server.folder)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    reader = FrameReader(sock, secret)
    challenge = reader.read()
    sock.sendall(encode({"type": "hello", "nonce": challenge["nonce"], "seq": 0}, secret))
    frame = encode({"type": "request", "seq": 1, "op": "apply", "args": {}}, secret)
    sock.sendall(frame)
    assert reader.read()["ok"] is True
    sock.sendall(frame)  # captured and sent again
    assert reader.read() is None  # no answer: the connection is closed
    sock.close()
    assert [op for op, _ in server.calls] == ["apply"]  # run once


def _ops(apply_class: str, *, allow_inexact: bool = False) -> tuple[ControlOps, list]:
    sent: list = []
    live = LiveState()
    live.update(recommendations=[recommendation("r", "t", apply_class=apply_class)])
    session = SimpleNamespace(live=live, options=SimpleNamespace(settings=AgentSettings(allow_inexact=allow_inexact)),
                              send_command=lambda c: sent.append(c) or 1, id="s", dir=Path("."))
    return ControlOps(session, AdviceLoop(session, budget_bytes=None), budget_bytes=None), sent


def test_a_remedy_that_changes_numerics_needs_the_callers_confirm() -> None:
    ops, sent = _ops("live-opt-in")
    try:
        with pytest.raises(RequestError, match="confirm=true"):
            ops("apply", {"recommendation_id": "r"})
        assert sent == []
        answer = ops("apply", {"recommendation_id": "r", "confirm": True})
    finally:
        ops.advice.close()
    assert answer["recommendation_id"] == "r" and answer["apply_class"] == "live-opt-in"
    [command] = sent
    assert command.confirmed is True and command.at_step == answer["at_step"]
    ops, sent = _ops("live-exact")
    try:
        ops("apply", {"recommendation_id": "r"})  # no consent needed: numerics unchanged
        with pytest.raises(RequestError, match="already in flight"):
            ops("apply", {"recommendation_id": "r"})  # one change at a time, as in the TUI
        with pytest.raises(RequestError, match="unknown request"):
            ops("__init__", {})
    finally:
        ops.advice.close()
    assert len(sent) == 1
