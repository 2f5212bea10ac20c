"""The socket's limits: capped connections, nothing large buffered before a signed hello,
numbered frames (no replays), commands only to authenticated agents."""

import socket
import struct
import threading
import time

import pytest
from test_wire import hello

import advisor.server as server_module

from advisor.agent.channel import AgentChannel
from advisor.records.samples import StepSample
from advisor.records.wire import FrameReader, encode, new_secret
from advisor.server import ChannelServer


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.01)


def _closed_by_peer(sock) -> bool:
    sock.settimeout(10)
    try:
        while True:
            if sock.recv(65536) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except OSError:
        return False


def test_connections_beyond_the_cap_are_closed_at_once():
    server = ChannelServer(new_secret(), lambda r: None, max_connections=2)
    socks = [socket.socket(socket.AF_UNIX) for _ in range(3)]
    try:
        for sock in socks[:2]:
            sock.connect(server.path)
            sock.settimeout(5)
            assert sock.recv(4)  # the challenge's length: these two are being served
        socks[2].connect(server.path)
        assert _closed_by_peer(socks[2])
        assert "connections already open" in server.last_rejection
    finally:
        for sock in socks:
            sock.close()
        server.close()


def test_a_large_frame_before_the_hello_is_refused_without_buffering():
    secret = new_secret()
    server = ChannelServer(secret, lambda r: None)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(server.path)
            FrameReader(sock, secret).read()  # the challenge
            sock.sendall(struct.pack(">I", 8 * 1024 * 1024))  # announces 8 MiB, unauthenticated
            assert _closed_by_peer(sock)
        _wait(lambda: server.rejected >= 1)
        assert "out of bounds" in server.last_rejection
    finally:
        server.close()


def test_replayed_frames_are_refused_on_the_same_and_on_another_connection():
    secret = new_secret()
    received = []
    server = ChannelServer(secret, received.append)
    try:
        frame = encode({"kind": "step", "data": StepSample(index=0, time_s=0.1).to_dict(), "seq": 1}, secret)
        with socket.socket(socket.AF_UNIX) as agent:
            agent.connect(server.path)
            hello(agent, secret)
            agent.sendall(frame + frame)  # the second is a replay
            agent.sendall(encode({"kind": "step", "data": StepSample(index=1, time_s=0.1).to_dict(), "seq": 2},
                                 secret))
            _wait(lambda: len(received) == 2)
        with socket.socket(socket.AF_UNIX) as intruder:  # replays a captured stream on a new connection
            intruder.connect(server.path)
            intruder.sendall(frame)
            assert _closed_by_peer(intruder)
        server.wait_readers(5)
        assert [r.index for r in received] == [0, 1]
        assert server.rejected >= 2
    finally:
        server.close()


def test_commands_go_only_to_authenticated_agents_and_half_sent_frames_do_not_hold_the_end():
    secret = new_secret()
    server = ChannelServer(secret, lambda r: None)
    got = []
    arrived = threading.Event()
    channel = AgentChannel(server.path, secret, spill_path=None, rank=3,
                           on_command=lambda c: (got.append(c), arrived.set()))
    stalled = []
    try:
        _wait(lambda: server.connections == 1)
        assert server.ranks == {3}
        for _ in range(5):  # connected, never authenticated, each halfway through a frame
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(server.path)
            sock.sendall(struct.pack(">I", 1000) + b"x" * 10)
            stalled.append(sock)
        assert server.broadcast({"type": "revert"}) == 1
        assert arrived.wait(5) and got == [{"type": "revert"}]
        for sock in stalled:  # they saw the challenge, never the command
            sock.settimeout(5)
            length = struct.unpack(">I", sock.recv(4))[0]
            body = b""
            while len(body) < length:
                body += sock.recv(length - len(body))
            assert b"challenge" in body
        channel.close(2)
        started = time.monotonic()
        server.wait_readers(60)
        assert time.monotonic() - started < 30  # not 5 s per stalled connection, nor the full 60
    finally:
        for sock in stalled:
            sock.close()
        server.close()


def test_a_hello_trickled_a_byte_at_a_time_is_closed_at_the_handshake_deadline(monkeypatch):
    """The limit is on the handshake as a whole: each byte arrives well within a per-read timeout,
    which is what kept 256 such connections (the server's every slot) open for 40 s."""
    monkeypatch.setattr(server_module, "HELLO_TIMEOUT_S", 1.0)
    secret = new_secret()
    server = ChannelServer(secret, lambda r: None)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(server.path)
            challenge = FrameReader(sock, secret).read()
            frame = encode({"type": "hello", "nonce": challenge["nonce"], "rank": 0, "seq": 0}, secret)
            started = time.monotonic()
            sent = 0
            with pytest.raises((BrokenPipeError, ConnectionResetError)):
                for byte in frame:  # ~130 bytes: 40 s at this pace, were it let through
                    sock.send(bytes([byte]))
                    sent += 1
                    time.sleep(0.3)  # the trickle itself: what the attacker does between bytes
            assert time.monotonic() - started < 3, f"closed after {sent} bytes"
            assert sent < len(frame)
        assert server.ranks == set()
    finally:
        server.close()


def test_an_agent_refused_while_the_slots_are_taken_retries_and_reports_live(tmp_path):
    secret = new_secret()
    received = []
    server = ChannelServer(secret, received.append, max_connections=1)
    spill = tmp_path / "spill-rank0.jsonl"
    stranger = socket.socket(socket.AF_UNIX)
    try:
        stranger.connect(server.path)
        FrameReader(stranger, secret).read()  # served: it holds the only slot
        channel = AgentChannel(server.path, secret, spill_path=str(spill))
        channel.emit({"kind": "step", "data": StepSample(index=0, time_s=0.1).to_dict()})
        _wait(lambda: "connections already open" in server.last_rejection)  # the agent was refused
        stranger.close()  # the slot frees, as the handshake deadline frees a stranger's
        _wait(lambda: [r.index for r in received] == [0])
        channel.close(5)
        assert server.ranks == {0}
        assert not spill.exists()  # it reported live, nothing spilled
    finally:
        stranger.close()
        server.close()
