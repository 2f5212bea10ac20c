"""Pass 1 over a Kineto trace: keep what the records need, in compact arrays, event by event.

A trace is streamed (``jsonstream``), never loaded whole: CPU ops become four numbers each
in ``array`` columns (start, duration, thread, interned signature), GPU kernels two or three,
and only the rare events (steps, phase annotations, collectives, memory counters) are kept as
small tuples. Events whose timestamp or duration is missing, not finite, negative, or beyond
any real run (Kineto writes overflowed unsigned values on some clocks) are skipped and counted.
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.importers.jsonstream import StreamError, open_text, stream_object
from advisor.records.samples import ADVISOR_SPAN_PREFIX

MAX_TS_US = 1e17  # about 3,000 years of microseconds: anything above is an overflowed clock
MAX_DUR_US = 1e11  # 28 hours: one event longer than this is an overflowed duration

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "c10d::", "record_param_comms")


def is_collective_name(name: str) -> bool:
    return name.startswith(COLLECTIVE_PREFIXES)


def is_nccl_kernel(name: str) -> bool:
    return name.lower().startswith("nccl")


@dataclass
class Span:
    """One kept event: thread, start and duration in the trace's microseconds, its args."""

    name: str
    tid: int
    ts: float
    dur: float
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class RankTrace:
    """What pass 1 keeps of one rank's trace file."""

    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0  # events with a missing or overflowed timestamp or duration
    events: int = 0
    steps: list[tuple[int, Span]] = field(default_factory=list)
    data: list[Span] = field(default_factory=list)  # DataLoader fetches
    optimizer: list[Span] = field(default_factory=list)  # Optimizer.step#...
    advisor: list[Span] = field(default_factory=list)  # the advisor agent's own work (advisor::...)
    zero_grad: list[Span] = field(default_factory=list)
    forward_marks: list[Span] = field(default_factory=list)  # nn.Module: / DDP.forward annotations
    reducer: list[Span] = field(default_factory=list)  # DDP's reducer work, which ends its backward
    collectives: list[Span] = field(default_factory=list)  # CPU-side collective ops and annotations
    nccl_kernels: list[Span] = field(default_factory=list)
    memory: list[tuple[float, int, int | None]] = field(default_factory=list)  # ts, allocated, reserved
    # CPU ops, one row each: start, duration (us), thread, signature id, external id
    op_ts: array = field(default_factory=lambda: array("d"))
    op_dur: array = field(default_factory=lambda: array("d"))
    op_tid: array = field(default_factory=lambda: array("q"))
    op_sig: array = field(default_factory=lambda: array("i"))
    op_ext: array = field(default_factory=lambda: array("q"))
    signatures: list[tuple[str, tuple, tuple, tuple]] = field(default_factory=list)
    _sig_ids: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    # GPU compute kernels (not NCCL): start, duration, external id of the launching op
    k_ts: array = field(default_factory=lambda: array("d"))
    k_dur: array = field(default_factory=lambda: array("d"))
    k_ext: array = field(default_factory=lambda: array("q"))

    @property
    def base_s(self) -> float:
        """Seconds to add to a trace timestamp (us / 1e6) for wall-clock time."""
        base = self.meta.get("baseTimeNanoseconds")
        return float(base) / 1e9 if isinstance(base, (int, float)) else 0.0

    def signature(self, name: str, args: dict[str, Any]) -> int:
        """The id of (name, input dims, input types, concrete inputs), interned: ``repr`` of the
        parsed lists is the key because it runs in C, several times faster than freezing them."""
        dims, types, concrete = args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs")
        key = (name, repr(dims), repr(types), repr(concrete))
        found = self._sig_ids.get(key)
        if found is None:
            found = self._sig_ids[key] = len(self.signatures)
            self.signatures.append((name, _freeze(dims), _freeze(types), _freeze(concrete)))
        return found


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value if isinstance(value, (int, float, str, type(None))) else str(value)


def thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def read_trace(path: Path) -> RankTrace:
    """Stream one trace file into a ``RankTrace``; raises ``StreamError`` on malformed JSON."""
    trace = RankTrace(path=path)

    def on_event(event: Any) -> None:
        if not isinstance(event, dict):
            return
        trace.events += 1
        ph = event.get("ph")
        if ph not in ("X", "i", "I"):
            return  # metadata, flows and counters carry nothing the records use
        ts = _number(event.get("ts"))
        dur = _number(event.get("dur", 0.0)) if ph == "X" else 0.0
        if ts is None or dur is None or ts < 0 or ts > MAX_TS_US or dur < 0 or dur > MAX_DUR_US:
            trace.skipped += 1
            return
        _keep(trace, event, ts, dur)

    with open_text(path) as raw:
        try:
            trace.meta = stream_object(raw, "traceEvents", on_event)
        except (OSError, EOFError) as exc:  # a truncated gzip stream
            raise StreamError(f"cannot read the file to its end ({exc})") from None
    return trace


def _keep(trace: RankTrace, event: dict[str, Any], ts: float, dur: float) -> None:
    name = str(event.get("name", ""))
    cat = str(event.get("cat", "")).lower()
    tid = event.get("tid")
    tid = tid if isinstance(tid, int) else hash(str(tid)) & 0x7FFFFFFF
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    if name == "[memory]":
        allocated = _number(args.get("Total Allocated"))
        reserved = _number(args.get("Total Reserved"))
        if allocated is not None:
            trace.memory.append((ts, int(allocated), int(reserved) if reserved is not None else None))
        return
    if event.get("ph") != "X":
        return
    if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        if cat == "kernel" and is_nccl_kernel(name):
            trace.nccl_kernels.append(Span(name, tid, ts, dur, dict(args)))
        else:
            ext = _number(args.get("External id"))
            trace.k_ts.append(ts)
            trace.k_dur.append(dur)
            trace.k_ext.append(int(ext) if ext is not None else -1)
        return
    match = STEP_RE.match(name)
    if match:
        trace.steps.append((int(match.group(1)), Span(name, tid, ts, dur)))
        return
    if "DataLoader" in name and name.startswith("enumerate("):
        trace.data.append(Span(name, tid, ts, dur))
        return
    if name.startswith(ADVISOR_SPAN_PREFIX) and cat == "user_annotation":
        trace.advisor.append(Span(name, tid, ts, dur))
        return
    if name.startswith("Optimizer.step#"):
        trace.optimizer.append(Span(name, tid, ts, dur))
        return
    if name.startswith("Optimizer.zero_grad#"):
        trace.zero_grad.append(Span(name, tid, ts, dur))
        return
    if name.startswith("nn.Module:") or (name.endswith(".forward") and cat == "user_annotation"):
        trace.forward_marks.append(Span(name, tid, ts, dur))
        return
    if "reducer::" in name and cat != "cpu_op":
        trace.reducer.append(Span(name, tid, ts, dur))
        return
    if is_collective_name(name):
        trace.collectives.append(Span(name, tid, ts, dur, dict(args)))
        # c10d ops are also CPU ops (they nest under autograd), so fall through for those.
        if not name.startswith("c10d::"):
            return
    if cat == "cpu_op":
        ext = _number(args.get("External id"))
        trace.op_ts.append(ts)
        trace.op_dur.append(dur)
        trace.op_tid.append(tid)
        trace.op_sig.append(trace.signature(name, args))
        trace.op_ext.append(int(ext) if ext is not None else -1)
