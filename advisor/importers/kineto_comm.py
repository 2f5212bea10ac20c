"""Collectives in a Kineto trace -> ``CollectiveStat`` records (nccl-tests conventions).

A call is the ``c10d::*`` op that issued it (or, in NCCL traces without it, the
``record_param_comms`` event) paired, per op kind and in order, with what ran it: an NCCL
kernel on the GPU, else gloo's or NCCL's ``gloo:*``/``nccl:*`` annotation on the backend's
thread. ``start`` is the issue (wall clock); ``time_s`` the kernel's duration on the GPU, else
issue to completion; ``exposed_s`` the part of that interval with no compute running (other
GPU kernels; on the CPU, the ops of the threads that do not run collectives, minus the
``c10d::*`` ops, in which they wait). Bytes come from the recorded shapes of the argument
that holds S (the same argument ``advisor.probes.comm.intercept`` reads).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict, deque
from typing import Any, Callable

from advisor.importers.formulas import DTYPE_BYTES, DTYPE_NAMES
from advisor.importers.kineto_read import RankTrace, Span
from advisor.records.events import CollectiveCall, CollectiveSeq
from advisor.records.intervals import exposed_s, merge_intervals, subtract_intervals
from advisor.records.samples import CollectiveStat, Event

# NCCL kernel names carry the element type: ncclDevKernel_AllReduce_Sum_f32_RING_LL.
_NCCL_DTYPES = {"f32": ("float32", 4), "f16": ("float16", 2), "bf16": ("bfloat16", 2), "f64": ("float64", 8),
                "i32": ("int32", 4), "i64": ("int64", 8), "u8": ("uint8", 1), "i8": ("int8", 1)}
_NCCL_DTYPE_RE = re.compile(r"_(f32|f16|bf16|f64|i32|i64|u8|i8)(?:_|\(|$)")


# c10d op -> (public op, index of the argument holding S), as advisor.probes.comm.intercept.
C10D_OPS: dict[str, tuple[str, int]] = {
    "allreduce_": ("all_reduce", 0), "allreduce_coalesced_": ("all_reduce", 0),
    "allgather_": ("all_gather", 0), "_allgather_base_": ("all_gather", 0),
    "allgather_coalesced_": ("all_gather", 0), "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "reduce_scatter_": ("reduce_scatter", 1), "_reduce_scatter_base_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1), "broadcast_": ("broadcast", 0),
    "reduce_": ("reduce", 0), "gather_": ("gather", 0), "scatter_": ("scatter", 1),
    "alltoall_": ("all_to_all", 0), "alltoall_base_": ("all_to_all", 0), "send": ("send", 0),
    "recv_": ("recv", 0), "recv_any_source_": ("recv", 0), "barrier": ("barrier", -1),
}


def public_op(name: str) -> str | None:
    """``c10d::allreduce_``, ``gloo:all_reduce``, ``nccl:all_gather``, ``ncclDevKernel_AllReduce_...``
    -> the probe's op name (``all_reduce``...); None for names that are not collectives."""
    if name.startswith("c10d::"):
        found = C10D_OPS.get(name[len("c10d::"):])
        return found[0] if found else None
    base = name.split(":", 1)[1] if name.startswith(("gloo:", "nccl:")) else name
    key = base.lower().replace("_", "").replace("ncclkernel", "").replace("nccldevkernel", "")
    for token, op in (("allreduce", "all_reduce"), ("allgather", "all_gather"),
                      ("reducescatter", "reduce_scatter"), ("broadcast", "broadcast"),
                      ("alltoall", "all_to_all"), ("sendrecv", "send"), ("send", "send"),
                      ("recv", "recv"), ("barrier", "barrier"), ("reduce", "reduce"),
                      ("gather", "gather"), ("scatter", "scatter")):
        if key.startswith(token):
            return op
    return None





def _size_of(types: Any) -> int:
    for t in types if isinstance(types, list) else []:
        if t in DTYPE_BYTES:
            return DTYPE_BYTES[t]
    return 4


def _numel_list(dims: Any) -> int:
    if isinstance(dims, list) and dims and all(isinstance(x, int) for x in dims):
        n = 1
        for x in dims:
            n *= x
        return n
    if isinstance(dims, list):
        return sum(_numel_list(d) for d in dims if isinstance(d, list) and d)
    return 0


def _issue_bytes(span: Span, exec_span: Span | None, group: int) -> tuple[int, str]:
    """(S in bytes per nccl-tests, dtype name) of one call from its recorded shapes."""
    args = span.args
    types = (exec_span.args.get("Input type") if exec_span else None) or args.get("Input type")
    raw = next((t for t in (types or []) if t in DTYPE_BYTES), "")
    dtype, size = DTYPE_NAMES.get(raw, ""), _size_of(types)
    in_name = _NCCL_DTYPE_RE.search(exec_span.name) if exec_span is not None else None
    if not raw and in_name:  # a TensorList argument records no dtype; the NCCL kernel's name has it
        dtype, size = _NCCL_DTYPES[in_name.group(1)]
    if span.name == "record_param_comms" or "In msg nelems" in args:
        op = public_op(str(args.get("Collective name", ""))) or ""
        named = str(args.get("dtype", ""))
        size = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4}.get(named, size)
        key = "Out msg nelems" if op == "all_gather" else "In msg nelems"
        return int(args.get(key) or 0) * size, dtype or named.lower()
    dims = args.get("Input Dims") or []
    if span.name.startswith("c10d::"):
        _, index = C10D_OPS.get(span.name[6:], ("", -1))
        nbytes = _numel_list(dims[index]) * size if 0 <= index < len(dims) else 0
    else:  # an executing annotation (gloo:/nccl:): its inputs are this rank's buffer
        nbytes = _numel_list(dims) * size
        if public_op(span.name) == "all_gather":
            nbytes *= group
    return nbytes, dtype


def collective_records(trace: RankTrace, world: int, *, rank: int, step_of: Callable[[float], Any],
                       names: list[str], wall: Callable[[float], float]) -> list[CollectiveStat | Event]:
    """One ``CollectiveStat`` per call; ``step_of(ts)`` gives the step a call belongs to.

    Where the trace names each call's process group and sequence number (``record_param_comms``
    nested in the issuing op, as NCCL traces record it), an ``Event("collective_seq")`` per step
    carries them, as the comm probe sends it, so calls are matched across ranks exactly.
    """
    issues = [s for s in trace.collectives if s.name.startswith("c10d::") and public_op(s.name)]
    if not issues:
        issues = [s for s in trace.collectives if s.name == "record_param_comms"]
    on_gpu = bool(trace.nccl_kernels)
    execs = trace.nccl_kernels if on_gpu else [
        s for s in trace.collectives if s.name.startswith(("gloo:", "nccl:")) and public_op(s.name)]
    comm_tids = {s.tid for s in execs}
    group = world or 1
    # Pair issue and execution per op kind, in order (a backend runs one group's calls in order).
    pending: dict[str, deque[Span]] = defaultdict(deque)
    for s in sorted(execs, key=lambda s: s.ts):
        pending[public_op(s.name) or ""].append(s)
    calls: list[tuple[str, Span | None, Span | None]] = []
    for s in sorted(issues, key=lambda s: s.ts):
        op = public_op(s.name if s.name != "record_param_comms" else str(s.args.get("Collective name", ""))) or ""
        queue = pending.get(op)
        calls.append((op, s, queue.popleft() if queue else None))
    for op, queue in pending.items():
        calls.extend((op, None, s) for s in queue)
    compute = _compute_intervals(trace, names, comm_tids, on_gpu)
    nested = bool(issues) and issues[0].name != "record_param_comms"
    params = _ParamComms([s for s in trace.collectives if s.name == "record_param_comms"] if nested else [])
    seqs: dict[int, list[CollectiveCall]] = defaultdict(list)
    members = _group_members(trace, world)
    out: list[CollectiveStat | Event] = []
    for op, issue, run in calls:
        first = issue or run
        assert first is not None
        if on_gpu and run is not None:
            interval = (run.ts, run.end)
        else:
            interval = (first.ts, max(s.end for s in (issue, run) if s is not None))
        meta = params.inside(issue) if issue is not None else None
        sizes = [m.args.get("Group size") for m in (issue, meta, run) if m is not None]
        size = next((v for v in sizes if isinstance(v, int) and v > 0), None)
        group_size = size if size is not None else group
        nbytes, dtype = _issue_bytes(issue if issue is not None else run, run, group_size)  # type: ignore[arg-type]
        step = step_of(first.ts)
        index = step.index if step else 0
        named = meta if meta is not None or issue is None or issue.name != "record_param_comms" else issue
        ranks = members.get(str(named.args.get("Process Group Name"))) if named is not None else None
        out.append(CollectiveStat(
            rank=rank, step=index, op=op, group_size=group_size, bytes=nbytes, dtype=dtype,
            group_ranks=list(ranks) if ranks is not None and len(ranks) == group_size else None,
            count=1, start=wall(first.ts), time_s=(interval[1] - interval[0]) / 1e6,
            exposed_s=exposed_s(interval, compute) / 1e6))
        seq = meta.args.get("Seq") if meta is not None else None
        if meta is not None and isinstance(seq, int) and op not in ("send", "recv"):
            seqs[index].append(CollectiveCall(op=op, group=str(meta.args.get("Process Group Name", "")), seq=seq,
                                              start=wall(first.ts)))
    out.extend(CollectiveSeq(calls=tuple(rows)).event(rank=rank, step=step) for step, rows in seqs.items())
    return out


def _group_members(trace: RankTrace, world: int) -> dict[str, list[int]]:
    """Process group name -> its global ranks, from ``distributedInfo.pg_config`` (the profiler
    records every group there), for groups smaller than the world, as the comm probe records them.
    Only NCCL traces name each call's group (``record_param_comms``); gloo's c10d ops do not."""
    info = trace.meta.get("distributedInfo")
    configs = info.get("pg_config") if isinstance(info, dict) else None
    out: dict[str, list[int]] = {}
    for pg in configs if isinstance(configs, list) else []:
        ranks = pg.get("ranks") if isinstance(pg, dict) else None
        if (isinstance(ranks, list) and 0 < len(ranks) < world
                and all(type(r) is int and 0 <= r < world for r in ranks) and isinstance(pg.get("pg_name"), str)):
            out[pg["pg_name"]] = ranks
    return out


class _ParamComms:
    """The ``record_param_comms`` events by thread and start, to find the one recorded inside an
    issuing op in O(log n) (a scan of all of them per call was quadratic in the trace's calls)."""

    SCAN = 64  # events looked at from the issue's start: a real op holds one

    def __init__(self, params: list[Span]) -> None:
        by_tid: dict[int, list[Span]] = defaultdict(list)
        for p in params:
            by_tid[p.tid].append(p)
        self._spans = {tid: sorted(spans, key=lambda p: p.ts) for tid, spans in by_tid.items()}
        self._starts = {tid: [p.ts for p in spans] for tid, spans in self._spans.items()}

    def inside(self, issue: Span) -> Span | None:
        """The first event on the issue's thread that starts and ends within it, if any."""
        spans = self._spans.get(issue.tid)
        if not spans:
            return None
        k = bisect.bisect_left(self._starts[issue.tid], issue.ts)
        for p in spans[k:k + self.SCAN]:
            if p.ts > issue.end:
                return None
            if p.end <= issue.end:
                return p
        return None


def _compute_intervals(trace: RankTrace, names: list[str], comm_tids: set[int],
                       on_gpu: bool) -> list[tuple[float, float]]:
    """When this rank computes: other GPU kernels, or top-level CPU ops of non-communication threads."""
    if on_gpu:
        return merge_intervals((a, a + d) for a, d in zip(trace.k_ts, trace.k_dur))
    rows = sorted((i for i in range(len(trace.op_ts)) if trace.op_tid[i] not in comm_tids),
                  key=lambda i: (trace.op_tid[i], trace.op_ts[i]))
    busy: list[tuple[float, float]] = []
    blocked: list[tuple[float, float]] = []
    for i in rows:
        a, b = trace.op_ts[i], trace.op_ts[i] + trace.op_dur[i]
        (blocked if names[trace.op_sig[i]].startswith("c10d::") else busy).append((a, b))
    return merge_intervals(subtract_intervals(busy, blocked))


