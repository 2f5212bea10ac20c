"""The channel: signed JSON frames, forged or malformed ones dropped, nothing unpickled."""

import socket
import struct
import sys
import threading
import time
from pathlib import Path

import pytest

from advisor.priority import BACKGROUND_NICENESS
from advisor.records.samples import Event, StepSample
from advisor.records.wire import (
    MAX_FRAME,
    FrameReader,
    WireError,
    decode,
    encode,
    new_secret,
)
from advisor.server import ChannelServer


def test_roundtrip_and_tamper_detection():
    secret = new_secret()
    frame = encode({"kind": "step", "data": {"index": 1}}, secret)
    assert decode(frame[4:], secret) == {"kind": "step", "data": {"index": 1}}
    with pytest.raises(WireError, match="HMAC"):
        decode(frame[4:], new_secret())  # forged: another secret
    tampered = bytearray(frame[4:])
    tampered[-3] ^= 0xFF
    with pytest.raises(WireError):
        decode(bytes(tampered), secret)


def test_non_object_and_non_json_rejected():
    import hashlib
    import hmac

    secret = new_secret()
    for payload in (b"[1, 2]", b"\x80\x04pickle"):
        body = hmac.new(secret, payload, hashlib.sha256).digest() + payload
        with pytest.raises(WireError):
            decode(body, secret)


def test_reader_skips_bad_frames_and_keeps_reading():
    secret = new_secret()
    a, b = socket.socketpair()
    a.sendall(encode({"n": 1}, new_secret()) + encode({"n": 2}, secret))
    a.close()
    reader = FrameReader(b, secret)
    assert reader.read() == {"n": 2}
    assert reader.rejected == 1
    assert reader.read() is None


def hello(sock, secret, rank=0):
    """The agent's side of the handshake, by hand: answer the signed challenge."""
    challenge = FrameReader(sock, secret).read()
    sock.sendall(encode({"type": "hello", "nonce": challenge["nonce"], "rank": rank, "seq": 0}, secret))


def test_server_drops_forged_messages_and_accepts_signed_ones():
    secret = new_secret()
    received = []
    server = ChannelServer(secret, received.append)
    try:
        good = StepSample(index=3, time_s=0.5, loss=1.25)
        with socket.socket(socket.AF_UNIX) as forger:
            forger.connect(server.path)
            forger.sendall(encode({"kind": "step", "data": {"index": 99, "time_s": 1.0}}, b"wrong-secret"))
            forger.sendall(struct.pack(">I", MAX_FRAME + 1))  # out-of-bounds length: connection dropped
            forger.settimeout(5)
            while forger.recv(4096):  # the challenge, then the server's close
                pass
        with socket.socket(socket.AF_UNIX) as agent:
            agent.connect(server.path)
            hello(agent, secret)
            agent.sendall(encode({"kind": "nonsense", "data": {}, "seq": 1}, secret))  # unknown kind: dropped
            agent.sendall(encode({"kind": "step", "data": good.to_dict(), "seq": 2}, secret))
        deadline = time.monotonic() + 5
        while not received and time.monotonic() < deadline:
            time.sleep(0.01)
        server.wait_readers(2)
        assert received == [good]
        while server.rejected < 3 and time.monotonic() < deadline + 5:  # the forger's reader may still run
            time.sleep(0.01)
        assert server.rejected >= 3
    finally:
        server.close()


def test_socket_is_owner_only():
    import os
    import stat

    server = ChannelServer(new_secret(), lambda r: None)
    try:
        assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(server.path)).st_mode) == 0o700
    finally:
        server.close()


def test_commands_reach_connected_agents():
    from advisor.agent.channel import AgentChannel

    secret = new_secret()
    server = ChannelServer(secret, lambda r: None)
    got = []
    done = threading.Event()
    channel = AgentChannel(server.path, secret, spill_path=None,
                           on_command=lambda c: (got.append(c), done.set()))
    try:
        deadline = time.monotonic() + 5
        while server.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.broadcast({"type": "revert"}) == 1
        assert done.wait(5)
        assert got == [{"type": "revert"}]
    finally:
        channel.close(1)
        server.close()


def _connected():
    """(records received, controller's server, agent's channel), the channel connected to it."""
    from advisor.agent.channel import AgentChannel

    secret = new_secret()
    received = []
    server = ChannelServer(secret, received.append)
    channel = AgentChannel(server.path, secret, spill_path=None)
    deadline = time.monotonic() + 5
    while not channel.connected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert channel.connected
    return received, server, channel


def test_agent_sends_records_in_batches_not_one_write_per_record():
    """Records emitted within one send interval go out in one write: the training thread's emit
    wakes no thread, so a step boundary pays no thread hand-off for its record (issue 15)."""
    received, server, channel = _connected()
    try:
        writes = channel.writes
        for i in range(40):
            channel.emit({"kind": "step", "data": StepSample(index=i, time_s=0.1).to_dict()})
        deadline = time.monotonic() + 5
        # the controller can read the batch before the sender thread counts it: await both
        while (len(received) < 40 or channel.sent < 40) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r.index for r in received] == list(range(40))
        assert channel.sent == 40 and channel.writes - writes <= 2  # at most split by one send round
    finally:
        channel.close(1)
        server.close()


def _nice(tid: int) -> int:
    return int(Path(f"/proc/self/task/{tid}/stat").read_text().rpartition(")")[2].split()[16])


def test_drain_returns_once_everything_emitted_is_sent(monkeypatch):
    """A deep step's boundary drains the channel: its thousand records are encoded while the job
    waits between steps, not beside the next step. With a send interval far longer than the test,
    only the drain can have sent them."""
    from advisor.agent import channel as channel_module

    monkeypatch.setattr(channel_module, "SEND_INTERVAL_S", 600.0)
    received, server, channel = _connected()
    try:
        for i in range(1000):
            channel.emit({"kind": "step", "data": StepSample(index=i, time_s=0.1).to_dict()})
        assert channel.drain(timeout=60)
        assert channel.sent == 1000
        assert channel.drain(timeout=0)  # nothing buffered: returns at once
        if sys.platform == "linux":  # the controller's intake of records runs below the job's priority
            [reader] = [t for t in threading.enumerate() if t.name == "advisor-recv"]
            assert _nice(reader.native_id) == min(19, _nice(threading.get_native_id()) + BACKGROUND_NICENESS)
    finally:
        channel.close(1)
        server.close()


def test_the_senders_wake_is_used_up_by_the_wait_that_sees_it():
    from advisor.agent.channel import Wake

    wake = Wake()
    assert wake.wait(0.01) is False  # unset: the wait runs out
    wake.set()
    wake.set()  # set twice before a wait: one wake-up, no error
    assert wake.wait(5.0) is True
    assert wake.wait(0.01) is False  # used up
    seen = []
    waiter = threading.Thread(target=lambda: seen.append(wake.wait(30.0)))
    waiter.start()
    wake.set()  # from another thread, while the waiter waits
    waiter.join(30.0)
    assert seen == [True]


def test_drain_does_not_wait_for_a_controller_not_connected(tmp_path):
    """A sender still trying to connect completes no round: a deep step's boundary waited the whole
    drain timeout for it. Unconnected, drain returns at once and the records stay buffered."""
    from advisor.agent.channel import RETRY_S, AgentChannel

    channel = AgentChannel(str(tmp_path / "no-controller.sock"), new_secret(), spill_path=None)
    try:
        channel.emit({"kind": "step", "data": StepSample(index=0, time_s=0.1).to_dict()})
        started = time.monotonic()
        assert channel.drain(timeout=60)
        assert time.monotonic() - started < RETRY_S / 2 and channel.sent == 0  # it retries for RETRY_S
    finally:
        channel.close(1)


def test_an_exit_record_goes_out_at_once_not_at_the_next_round(monkeypatch):
    """A process whose peer died may be torn down by its launcher before the next send round: its
    exit record and a lost peer's verdict wake the sender (a step record does not)."""
    from advisor.agent import channel as agent_channel

    monkeypatch.setattr(agent_channel, "SEND_INTERVAL_S", 30.0)
    secret = new_secret()
    received = []
    server = ChannelServer(secret, received.append)
    channel = agent_channel.AgentChannel(server.path, secret, spill_path=None)
    try:
        deadline = time.monotonic() + 5
        while not channel.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert channel.connected
        time.sleep(0.2)  # the sender is now in its 30 s wait
        channel.emit({"kind": "step", "data": StepSample(index=0, time_s=0.1).to_dict()})
        channel.emit({"kind": "event", "data": Event(name="peer_lost", data={"ranks": [1]}).to_dict()})
        deadline = time.monotonic() + 5
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r.KIND for r in received] == ["step", "event"]  # the step went with the urgent one
    finally:
        channel.close(1)
        server.close()


def test_agent_spills_locally_when_controller_is_gone(tmp_path):
    import json

    from advisor.agent.channel import AgentChannel

    spill = tmp_path / "spill-rank0.jsonl"
    channel = AgentChannel(str(tmp_path / "no-such.sock"), new_secret(), spill_path=str(spill))
    channel.emit({"kind": "step", "data": StepSample(index=0, time_s=0.1).to_dict()})
    channel.close(10)
    lines = spill.read_text().splitlines()
    assert json.loads(lines[0])["data"]["index"] == 0
    assert oct(spill.stat().st_mode & 0o777) == oct(0o600)


def test_a_step_whose_loss_is_nan_passes_the_controllers_edge() -> None:
    """A job training on NaN (pytorch/examples' FSDP2 example on CPU) had every step dropped at the
    controller ("step.losses: expected a number, got NoneType"): a NaN is sent as null, in
    ``loss`` and in ``losses`` alike, and the step is kept."""
    import math

    from advisor.intake import parse_record

    step = StepSample(index=3, time_s=0.1, loss=math.nan, losses=[math.nan, 1.5])
    decoded = parse_record("step", step.to_dict())
    assert decoded.index == 3 and decoded.loss is None and decoded.losses == [None, 1.5]


def test_a_rounds_records_go_out_as_one_frame_and_an_unencodable_one_alone_is_dropped():
    received, server, channel = _connected()
    try:
        frames = channel.frames
        bad = {"kind": "step", "data": {"index": 99, "time_s": float("nan")}}  # JSON cannot hold NaN
        for i in range(30):
            channel.emit({"kind": "step", "data": StepSample(index=i, time_s=0.1).to_dict()})
            if i == 10:
                channel.emit(bad)
        assert channel.drain(5)
        deadline = time.monotonic() + 5
        while len(received) < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r.index for r in received] == list(range(30))
        assert channel.dropped == 1
        assert channel.sent == 30
        clean = channel.frames
        for i in range(30, 60):
            channel.emit({"kind": "step", "data": StepSample(index=i, time_s=0.1).to_dict()})
        assert channel.drain(5)
        assert channel.frames - clean <= 2  # a round's records in one frame (at most two rounds)
        assert clean - frames >= 30  # the round with the bad record went one frame per record
    finally:
        channel.close(1)
        server.close()


def test_a_batch_frame_numbers_its_records_and_a_replayed_or_overlapping_batch_is_refused():
    secret = new_secret()
    received = []
    server = ChannelServer(secret, lambda record, origin: received.append((record.index, origin[1])),
                           with_origin=True)
    try:
        steps = [{"kind": "step", "data": StepSample(index=i, time_s=0.1).to_dict()} for i in range(5)]
        first = encode({"seq": 3, "batch": steps[:3]}, secret)
        with socket.socket(socket.AF_UNIX) as agent:
            agent.connect(server.path)
            hello(agent, secret)
            agent.sendall(first + first)  # the second is a replay
            agent.sendall(encode({"seq": 4, "batch": steps[3:5]}, secret))  # numbers 3-4: overlaps 3, refused
            agent.sendall(encode({"seq": 6, "batch": [steps[3], "not a record", steps[4]]}, secret))
            deadline = time.monotonic() + 5
            while (len(received) < 5 or server.rejected < 3) and time.monotonic() < deadline:
                time.sleep(0.01)
        server.wait_readers(5)
        assert received == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 6)]
        assert server.rejected == 3
    finally:
        server.close()
