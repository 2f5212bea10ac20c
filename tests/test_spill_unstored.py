"""A controller killed with records in its socket buffer: the agent had counted them as sent.

Seen in CI: `attach` killed 0.5 s in, the report of the finished run lacked step 2 (steps 0-1
stored, 3-39 spilled). The agent now spills what it sent in its last seconds with each frame's
connection and number, and the reader skips the ones the store committed."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

from advisor.agent.channel import AgentChannel
from advisor.paths import DB_NAME, new_session_dir
from advisor.records.samples import RunInfo, StepSample
from advisor.records.wire import FrameReader, encode, new_secret
from advisor.store import SessionStore, load_state


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class _DeafController:
    """Answers the handshake, then reads nothing: what the agent sends stays in the socket, as in a
    controller that is killed before reading it."""

    def __init__(self, secret: bytes, folder: Path) -> None:
        self.path = str(folder / "c.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(1)
        self.conn: socket.socket | None = None
        self._secret = secret
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        conn, _ = self._listener.accept()
        conn.sendall(encode({"type": "challenge", "nonce": "conn-1", "seq": 0}, self._secret))
        FrameReader(conn, self._secret).read()  # the hello
        self.conn = conn

    def die(self) -> None:
        assert self.conn is not None
        self.conn.close()  # unread frames are discarded with the socket, as at a SIGKILL
        self._listener.close()


def _step(i: int) -> dict:
    return {"kind": "step", "data": StepSample(index=i, time_s=0.1).to_dict()}


def test_frames_sent_to_a_controller_that_dies_before_reading_them_are_spilled_with_their_numbers(tmp_path) -> None:
    secret = new_secret()
    controller = _DeafController(secret, tmp_path)
    spill = tmp_path / "spill-rank0.jsonl"
    channel = AgentChannel(controller.path, secret, spill_path=str(spill))
    try:
        _until(lambda: channel.connected and controller.conn is not None)
        for i in range(5):
            channel.emit(_step(i))
        _until(lambda: channel.sent == 5)  # in the controller's socket, never read
        controller.die()
        for i in range(5, 8):
            channel.emit(_step(i))
        _until(lambda: channel.spilled >= 8)
    finally:
        channel.close(2)
    lines = [json.loads(line) for line in spill.read_text().splitlines()]
    assert [line["data"]["index"] for line in lines] == list(range(8))
    assert [(line.get("conn"), line.get("seq")) for line in lines[:5]] == [("conn-1", s) for s in range(1, 6)]
    assert all("seq" not in line for line in lines[5:])  # never sent: nothing to tell apart


def test_spilled_copies_of_stored_frames_are_read_once() -> None:
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, finished=False, nproc_per_node=1)
    store.put(RunInfo(script="t.py", argv=[]))
    for i in range(3):  # frames 1-3 of connection conn-1 reached the store
        store.put(StepSample(index=i, time_s=0.1), ("conn-1", i + 1))
    store.close()
    with open(folder / "spill-rank0.jsonl", "w") as spill:
        for i in range(1, 5):  # the agent's recent frames 2-5, then one it never sent
            spill.write(json.dumps({**_step(i), "conn": "conn-1", "seq": i + 1}) + "\n")
        spill.write(json.dumps(_step(5)) + "\n")
        # A frame of another connection (a restarted worker) with a low number is not skipped.
        spill.write(json.dumps({**_step(6), "conn": "conn-2", "seq": 1}) + "\n")
    state = load_state(folder / DB_NAME)
    assert [s.index for s in state.steps[0]] == list(range(7))
