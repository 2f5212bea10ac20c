"""Pass 1 over a Kineto trace: keep what the records need, in compact arrays, event by event.

A trace is streamed (``jsonstream``), never loaded whole: CPU ops become four numbers each
in ``array`` columns (start, duration, thread, interned signature), GPU kernels two or three,
and only the rare events (steps, phase annotations, collectives, memory counters) are kept as
small tuples. Events whose timestamp or duration is missing, not finite, negative, or beyond
any real run (Kineto writes overflowed unsigned values on some clocks) are skipped and counted,
and so are events with wrong-typed fields (a list for a thread id, an id past 64 bits, shapes
nested past reason). What is kept is bounded (``limits``): a trace past a limit is refused with
``LimitError``, before it can take the host's memory.
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.importers.jsonstream import StreamError, open_text, stream_object
from advisor.importers.limits import (
    MAX_INT,
    MAX_NAME,
    MAX_OPS,
    MAX_SIGNATURE_CHARS,
    MAX_SIGNATURES,
    MAX_SPANS,
    MAX_STEP_INDEX,
    MAX_STEPS,
    LimitError,
    bounded_int,
    check_count,
)
from advisor.records.samples import ADVISOR_SPAN_PREFIX

MAX_TS_US = 1e17  # about 3,000 years of microseconds: anything above is an overflowed clock
MAX_DUR_US = 1e11  # 28 hours: one event longer than this is an overflowed duration

STEP_RE = re.compile(r"^ProfilerStep#(\d{1,10})$")
# The top-level keys the records use; any other is read past and let go.
META_KEYS = frozenset({"distributedInfo", "deviceProperties", "baseTimeNanoseconds", "record_shapes", "host_name"})
# The args of collectives and NCCL kernels the records use (kineto_comm); the rest is not kept.
COMM_ARGS = frozenset({"Input type", "Input Dims", "In msg nelems", "Out msg nelems", "Collective name", "dtype",
                       "Group size", "Process Group Name", "Seq"})
_SHAPE_DEPTH = 4  # Input Dims: a list of shapes, or of lists of shapes (TensorList), no deeper
COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "c10d::", "record_param_comms")


def is_collective_name(name: str) -> bool:
    return name.startswith(COLLECTIVE_PREFIXES)


def is_nccl_kernel(name: str) -> bool:
    return name.lower().startswith("nccl")


@dataclass(slots=True)
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

    _sig_chars: int = 0

    @property
    def base_s(self) -> float:
        """Seconds to add to a trace timestamp (us / 1e6) for wall-clock time (0 for a missing,
        non-finite or impossible base: a NaN here made every record's time NaN)."""
        base = self.meta.get("baseTimeNanoseconds")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not 0 <= base < 1e20:
            return 0.0
        return float(base) / 1e9

    def signature(self, name: str, args: dict[str, Any]) -> int:
        """The id of (name, input dims, input types, concrete inputs), interned: ``repr`` of the
        parsed lists is the key because it runs in C, several times faster than freezing them."""
        dims, types, concrete = args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs")
        key = (name, repr(dims), repr(types), repr(concrete))
        found = self._sig_ids.get(key)
        if found is None:
            self._sig_chars += sum(map(len, key))
            check_count(len(self.signatures) + 1, MAX_SIGNATURES, "distinct op signatures (op, shapes, types)")
            check_count(self._sig_chars, MAX_SIGNATURE_CHARS, "characters of op signatures")
            frozen = (name, _freeze(dims), _freeze(types), _freeze(concrete))
            found = self._sig_ids[key] = len(self.signatures)
            self.signatures.append(frozen)
        return found

    def keep(self, spans: list, span: Any, what: str) -> None:
        """Append a kept span, within the limits (``LimitError`` past them)."""
        check_count(len(spans) + 1, MAX_STEPS if spans is self.steps else MAX_SPANS, what,
                    "; profile fewer steps (torch.profiler.schedule) or split the trace")
        spans.append(span)


class _Malformed(ValueError):
    """An event field of the wrong type or out of range: the event is skipped and counted."""


def _freeze(value: Any, depth: int = 0) -> Any:
    if isinstance(value, list):
        if depth >= _SHAPE_DEPTH:
            raise _Malformed("shapes nested too deep")
        return tuple(_freeze(v, depth + 1) for v in value)
    if isinstance(value, (int, float, str, type(None))):
        return value
    raise _Malformed(f"a {type(value).__name__} among the recorded inputs")


def _comm_args(args: dict[str, Any]) -> dict[str, Any]:
    """The args of a collective the records use, each checked (an int in range, a string, a list)."""
    out: dict[str, Any] = {}
    for key in COMM_ARGS.intersection(args):
        value = args[key]
        if key in ("In msg nelems", "Out msg nelems", "Group size", "Seq"):
            value = bounded_int(value)
        elif key in ("Collective name", "dtype", "Process Group Name"):
            value = value[:MAX_NAME] if isinstance(value, str) else None
        elif key == "Input Dims":
            _freeze(value)  # checks the nesting and the element types
            value = value if isinstance(value, list) else None
        elif key == "Input type":
            value = [t for t in value if isinstance(t, str)] if isinstance(value, list) else None
        if value is not None:
            out[key] = value
    return out


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
        try:
            _keep(trace, event, ts, dur)
        except LimitError:
            raise
        except (_Malformed, TypeError, ValueError, OverflowError, RecursionError):
            trace.skipped += 1  # one wrong-typed event never costs the trace

    with open_text(path) as raw:
        try:
            trace.meta = stream_object(raw, "traceEvents", on_event, keep=META_KEYS)
        except (OSError, EOFError) as exc:  # a truncated gzip stream
            raise StreamError(f"cannot read the file to its end ({exc})") from None
    return trace


def _tid(value: Any) -> int:
    """A thread id: an integer as it is, a string hashed to one (Kineto names some threads)."""
    if type(value) is int and -MAX_INT <= value <= MAX_INT:
        return value
    if isinstance(value, str):
        return hash(value) & 0x7FFFFFFF
    if value is None:
        return 0
    raise _Malformed(f"a thread id that is a {type(value).__name__}")


def _ext_id(args: dict[str, Any]) -> int:
    ext = _number(args.get("External id"))
    return int(ext) if ext is not None and 0 <= ext <= MAX_INT else -1


def _text(value: Any) -> str:
    """A name or category: a string (cut to ``MAX_NAME``), never the text of a nested value."""
    if isinstance(value, str):
        return value[:MAX_NAME]
    if value is None:
        return ""
    raise _Malformed(f"a name that is a {type(value).__name__}")


def _keep(trace: RankTrace, event: dict[str, Any], ts: float, dur: float) -> None:
    name = _text(event.get("name"))
    cat = _text(event.get("cat")).lower()
    tid = _tid(event.get("tid"))
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    if name == "[memory]":
        allocated = bounded_int(_int_of(args.get("Total Allocated")))
        reserved = bounded_int(_int_of(args.get("Total Reserved")))
        if allocated is not None:
            trace.keep(trace.memory, (ts, allocated, reserved), "memory events")
        return
    if event.get("ph") != "X":
        return
    if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        if cat == "kernel" and is_nccl_kernel(name):
            trace.keep(trace.nccl_kernels, Span(name, tid, ts, dur, _comm_args(args)), "NCCL kernels")
        else:
            check_count(len(trace.op_ts) + len(trace.k_ts) + 1, MAX_OPS, "ops and kernels")
            trace.k_ts.append(ts)
            trace.k_dur.append(dur)
            trace.k_ext.append(_ext_id(args))
        return
    match = STEP_RE.match(name)
    if match:
        index = int(match.group(1))
        if index > MAX_STEP_INDEX:
            raise _Malformed(f"step number {index}")
        trace.keep(trace.steps, (index, Span(name, tid, ts, dur)), "ProfilerStep spans")
        return
    if "DataLoader" in name and name.startswith("enumerate("):
        trace.keep(trace.data, Span(name, tid, ts, dur), "DataLoader spans")
        return
    if name.startswith(ADVISOR_SPAN_PREFIX) and cat == "user_annotation":
        trace.keep(trace.advisor, Span(name, tid, ts, dur), "advisor spans")
        return
    if name.startswith("Optimizer.step#"):
        trace.keep(trace.optimizer, Span(name, tid, ts, dur), "optimizer steps")
        return
    if name.startswith("Optimizer.zero_grad#"):
        trace.keep(trace.zero_grad, Span(name, tid, ts, dur), "zero_grad spans")
        return
    if name.startswith("nn.Module:") or (name.endswith(".forward") and cat == "user_annotation"):
        trace.keep(trace.forward_marks, Span(name, tid, ts, dur), "module annotations")
        return
    if "reducer::" in name and cat != "cpu_op":
        trace.keep(trace.reducer, Span(name, tid, ts, dur), "DDP reducer spans")
        return
    if is_collective_name(name):
        trace.keep(trace.collectives, Span(name, tid, ts, dur, _comm_args(args)), "collectives")
        # c10d ops are also CPU ops (they nest under autograd), so fall through for those.
        if not name.startswith("c10d::"):
            return
    if cat == "cpu_op":
        check_count(len(trace.op_ts) + len(trace.k_ts) + 1, MAX_OPS, "ops and kernels")
        sig = trace.signature(name, args)  # first: a malformed signature leaves no half row
        trace.op_ts.append(ts)
        trace.op_dur.append(dur)
        trace.op_tid.append(tid)
        trace.op_sig.append(sig)
        trace.op_ext.append(_ext_id(args))


def _int_of(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and abs(number) < 2**63 else None
