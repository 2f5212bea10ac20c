"""Fuzzing the controller's record intake: signed frames of any shape reach the server, the store,
``load_state``, the report and the listing. Nothing may crash, and every good record sent between
bad ones is kept, in order."""

import hashlib
import hmac
import io
import json
import socket
import struct
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from test_wire import hello

from advisor.listing import print_sessions
from advisor.records.samples import (
    RECORD_TYPES,
    Event,
    ExitInfo,
    MemorySample,
    RunInfo,
    StepSample,
)
from advisor.records.wire import encode
from advisor.render import print_report
from advisor.report import build_report
from advisor.controller import AttachOptions, Session
from advisor.store import load_state

HUGE_INT = st.integers(min_value=2**63, max_value=2**300) | st.integers(max_value=-(2**63) - 1,
                                                                         min_value=-(2**300))
SCALARS = (st.none() | st.booleans() | st.integers() | HUGE_INT | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=20) | st.sampled_from(["[/x]", "[bold]", "\x00", "\ud800"])
           | st.integers(0, 300_000).map(lambda n: "y" * n))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
KINDS = st.sampled_from(sorted(RECORD_TYPES)) | st.text(max_size=10) | JSON


def _good(n: int) -> list:
    """Good records a real agent sends, each different (step n, events and exits naming n)."""
    return [
        StepSample(index=n, time_s=0.01 * (n + 1), loss=float(n), phases={"forward_s": 0.01}),
        Event(rank=0, step=n, name="warning", data={"message": f"note [/{n}]"}),
        MemorySample(step=n, time=0.0, categories={"parameter": 10}, total_bytes=10),
    ][n % 3]


@st.composite
def bad_messages(draw):
    """Right kind with one field of a random type, a random kind, or not a record at all."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        record = draw(st.sampled_from([StepSample(index=1, time_s=0.1), ExitInfo(code=1, reason="x"),
                                       RunInfo(script="s", argv=[]), Event(name="apply_result"),
                                       Event(name="oom"), MemorySample(step=1, time=0.0)]))
        data = record.to_dict()
        field = draw(st.sampled_from(sorted(data)))
        data[field] = draw(JSON)
        if record.KIND == "event" and draw(st.booleans()):
            data["data"] = draw(st.dictionaries(st.sampled_from(["at_step", "status", "remedy", "message",
                                                                 "inclusive_bytes", "requested_bytes"]), JSON))
        return {"kind": record.KIND, "data": data}
    if choice == 1:
        return {"kind": draw(KINDS), "data": draw(JSON)}
    if choice == 2:
        return draw(JSON)  # a frame that is not even a message
    return DEEP


def _signed(payload: bytes, secret: bytes) -> bytes:
    mac = hmac.new(secret, payload, hashlib.sha256).digest()
    return struct.pack(">I", len(payload) + len(mac)) + mac + payload


DEEP = object()  # a record nested deeper than json's recursion limit


def _payload(message, seq) -> bytes:
    if message is DEEP:
        return b'{"kind": "event", "seq": %d, "data": {"name": "x", "data": ' % seq + b"[" * 5000 + b"]" * 5000 + b"}}"
    if isinstance(message, dict):
        message = {**message, "seq": seq}
    return json.dumps(message, allow_nan=True).encode("utf-8", "surrogatepass")


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.integers(0, 10**6).map(lambda _: None), bad_messages()), min_size=1, max_size=12))
def test_bad_frames_never_crash_and_good_records_between_them_are_kept(tmp_path_factory, plan):
    folder = tmp_path_factory.mktemp("fuzz")
    script = folder / "t.py"
    script.write_text("")
    session = Session(AttachOptions(script=str(script)))
    good = []
    try:
        with socket.socket(socket.AF_UNIX) as agent:
            agent.connect(session.server.path)
            hello(agent, session._secret)
            frames = [_signed(_payload({"kind": "run", "data": RunInfo(script="t.py", argv=[]).to_dict()}, 1),
                              session._secret)]
            seq = 1
            for item in plan:
                seq += 1
                if item is None:
                    record = _good(len(good))
                    good.append(record)
                    frames.append(encode({"kind": record.KIND, "data": record.to_dict(), "seq": seq},
                                         session._secret))
                else:
                    frames.append(_signed(_payload(item, seq), session._secret))
            seq += 1
            frames.append(encode({"kind": "exit", "data": ExitInfo(code=0, reason="completed").to_dict(),
                                  "seq": seq}, session._secret))
            agent.sendall(b"".join(frames))
            deadline = time.monotonic() + 30
            while not session.live.snapshot().exits and time.monotonic() < deadline:
                time.sleep(0.01)
        code, _ = session.finish(0)
        assert code == 0
        live = session.live.snapshot()
    finally:
        session.close()
    for state in (live, load_state(session.db_path)):
        kept = iter([*(s for steps in state.steps.values() for s in steps), *state.events, *state.memory])
        kept_all = list(kept)
        for record in good:
            assert record in kept_all
        report = build_report(state)
        json.dumps(report, allow_nan=False, default=str)
        print_report(report, Console(file=io.StringIO(), width=120))
    print_sessions(Console(file=io.StringIO(), width=120))
