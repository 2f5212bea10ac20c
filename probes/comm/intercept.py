"""See every collective and point-to-point call a process issues, whoever issues it.

Interception point: the dispatcher. Since torch 2.0 every ``ProcessGroup`` method
(``allreduce``, ``_allgather_base``, ...) goes through a ``c10d::*`` operator, whether the
caller is the script (``torch.distributed.all_reduce``), DDP's C++ reducer, FSDP2
(``fully_shard``), ``ZeroRedundancyOptimizer`` or pipelining's send/recv. We register one
Python kernel per ``c10d`` op at the ``Autograd`` alias key with ``torch.library.Library``;
it stamps the call and redispatches below autograd to the real backend kernel, so the
call runs unchanged. This costs one Python call per collective (not per aten op, as a
TorchDispatchMode would) and never replaces a user's DDP comm hook. Checked on torch
2.13 CPU with gloo: DDP's bucket all-reduce, FSDP2's all-gather/reduce-scatter and ZeRO's
broadcasts all arrive here (see tests/test_comm_distributed.py).

Completion: the work's ``torch.futures.Future`` done-callback stamps the end on gloo's
thread (wall clock, ``time.time()``). Works without a future get their end when a
Python-level ``Work.wait()`` returns, or at the next poll that finds them completed. ``Work.wait`` is wrapped too, so the time the main thread spends
blocked in a Python-level wait is known (used for exposed time).
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

# c10d op -> (public op name, index of the tensor argument(s) holding S, index of the group).
# S follows nccl-tests: the full buffer for all-reduce/broadcast, the gathered output for
# all-gather, the unscattered input for reduce-scatter.
C10D_OPS: dict[str, tuple[str, int, int]] = {
    "allreduce_": ("all_reduce", 0, 1),
    "allreduce_coalesced_": ("all_reduce", 0, 1),
    "allgather_": ("all_gather", 0, 2),
    "_allgather_base_": ("all_gather", 0, 2),
    "allgather_coalesced_": ("all_gather", 0, 2),
    "allgather_into_tensor_coalesced_": ("all_gather", 0, 2),
    "reduce_scatter_": ("reduce_scatter", 1, 2),
    "_reduce_scatter_base_": ("reduce_scatter", 1, 2),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 2),
    "broadcast_": ("broadcast", 0, 1),
    "reduce_": ("reduce", 0, 1),
    "gather_": ("gather", 0, 2),
    "scatter_": ("scatter", 1, 2),
    "alltoall_": ("all_to_all", 0, 2),
    "alltoall_base_": ("all_to_all", 0, 2),
    "send": ("send", 0, 1),
    "recv_": ("recv", 0, 1),
    "recv_any_source_": ("recv", 0, 1),
    "barrier": ("barrier", -1, 1),
}
P2P_OPS = frozenset({"send", "recv"})

_internal = threading.local()


@contextmanager
def advisor_internal() -> Any:
    """The advisor's own collectives on this thread (the multi-node command relay): run, not recorded,
    so the job's collectives, their sequence numbers and its comm figures stay the script's own."""
    previous = getattr(_internal, "active", False)
    _internal.active = True
    try:
        yield
    finally:
        _internal.active = previous


@dataclass
class CallRecord:
    """One intercepted call (mutable: the end is filled in when the work completes)."""

    op: str
    c10d_op: str
    group: str
    group_size: int
    bytes: int
    dtype: str
    seq: int  # per-group issue counter; p2p ops count per (group, op) and are not matched
    start: float  # time.time() at issue
    thread: int  # threading.get_ident() of the issuing thread
    in_backward: bool
    device: str  # "cpu" | "cuda"
    end: float | None = None  # time.time() at completion
    extra: dict[str, Any] = field(default_factory=dict)
    # The group's global ranks, in group-rank order, for a group smaller than the world; None for
    # the whole world (every rank is a member) or where they are not known.
    group_ranks: tuple[int, ...] | None = None

    @property
    def time_s(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - self.start)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _unbox(cls: Any, obj: Any) -> Any:
    # Inside a dispatcher kernel c10d's custom classes arrive as torch.ScriptObject;
    # ``unbox`` gives back the Python binding (ProcessGroup / Work) with its methods.
    if isinstance(obj, torch.ScriptObject):
        return cls.unbox(obj)
    return obj


# ProcessGroup -> its members (``_members``), looked up once per group: this runs on every
# collective. Weak keys: a destroyed group is neither kept alive nor mistaken for a new one.
_MEMBERS: weakref.WeakKeyDictionary[Any, tuple[int, ...] | None] = weakref.WeakKeyDictionary()


def _group_info(pg: Any) -> tuple[str, int, tuple[int, ...] | None]:
    """(group name, size, global ranks of a group smaller than the world, else None)."""
    try:
        pg = _unbox(torch._C._distributed_c10d.ProcessGroup, pg)
    except Exception:
        pass
    try:
        size = int(pg.size())
    except Exception:  # a backend without size(): count as a world of one
        size = 1
    try:
        name = str(pg.group_name)
    except Exception:
        name = ""
    try:
        ranks = _MEMBERS[pg]
    except KeyError:
        ranks = _MEMBERS[pg] = _members(pg)
    except TypeError:  # None, or an object that is no ProcessGroup (not weakly referenceable)
        ranks = None
    return name, size, ranks


def _members(pg: Any) -> tuple[int, ...] | None:
    """The global ranks of ``pg`` (torch.distributed's record of the groups it made); None for the
    whole world, as the size already says who is in it, and for a group torch does not know."""
    try:
        ranks = tuple(int(r) for r in torch.distributed.get_process_group_ranks(pg))
        world = torch.distributed.get_world_size()
    except Exception:  # a group made outside torch.distributed's new_group, or no default group
        return None
    if not ranks or len(ranks) >= world or any(r < 0 for r in ranks):
        return None
    return ranks


class CollectiveInterceptor:
    """Installs the dispatcher-level kernels; ``calls`` fills as collectives are issued.

    ``on_call`` (optional) runs on the issuing thread after each call is recorded; the
    probe uses it to mark the end of backward compute.
    """

    def __init__(self, *, on_call: Callable[[CallRecord], None] | None = None, maxlen: int = 100_000) -> None:
        self.calls: deque[CallRecord] = deque(maxlen=maxlen)
        self.blocked: deque[tuple[float, float]] = deque(maxlen=maxlen)  # main-thread waits
        self.on_call = on_call
        self.main_thread = threading.main_thread().ident
        self._lib: torch.library.Library | None = None
        self._orig_wait: Callable[..., Any] | None = None
        self._seq: dict[tuple[str, str], itertools.count] = {}
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[Any, CallRecord]] = {}  # id(work) -> (work, call), no future
        self.errors = 0  # calls whose bookkeeping failed (the call itself still ran)

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        if self._lib is not None:
            return
        lib = torch.library.Library("c10d", "IMPL")
        for name in C10D_OPS:
            packet = getattr(torch.ops.c10d, name, None)
            if packet is None:  # an op this torch build lacks
                continue
            lib.impl(name, self._kernel(name, packet.default), "Autograd", with_keyset=True)
        self._lib = lib
        work_cls = torch._C._distributed_c10d.Work
        orig = work_cls.wait
        interceptor = self

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.time()
            try:
                return orig(work, *args, **kwargs)
            finally:
                interceptor._waited(work, t0, time.time())

        self._orig_wait = orig
        work_cls.wait = wait

    def uninstall(self) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
        if self._orig_wait is not None:
            torch._C._distributed_c10d.Work.wait = self._orig_wait
            self._orig_wait = None

    # ------------------------------------------------------------------ kernel
    def _kernel(self, name: str, op: Any) -> Callable[..., Any]:
        public, tensor_arg, group_arg = C10D_OPS[name]
        after_autograd = torch._C._after_autograd_keyset
        interceptor = self

        names = [a.name for a in op._schema.arguments]
        async_index = names.index("async_op") if "async_op" in names else None

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(_internal, "active", False):
                return op.redispatch(keyset & after_autograd, *args, **kwargs)
            start = time.time()
            out = op.redispatch(keyset & after_autograd, *args, **kwargs)
            # On torch 2.13 a synchronous torch.distributed call passes async_op=False and the
            # backend waits inside this call (no Python-level Work.wait()); older ones wait in Python.
            synchronous = (
                async_index is not None and len(args) > async_index and args[async_index] is False
            ) or kwargs.get("async_op") is False
            try:
                interceptor._record(public, name, args, tensor_arg, group_arg, start, out, synchronous)
            except Exception:  # never let bookkeeping break the user's collective
                interceptor.errors += 1
            return out

        return kernel

    def _record(
        self,
        public: str,
        name: str,
        args: tuple[Any, ...],
        tensor_arg: int,
        group_arg: int,
        start: float,
        out: Any,
        synchronous: bool,
    ) -> None:
        group, size, ranks = _group_info(args[group_arg])
        tensors = _tensors(args[tensor_arg]) if tensor_arg >= 0 else []
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if name == "gather_" and not nbytes:  # non-root ranks pass no outputs: S = input x n
            nbytes = sum(t.numel() * t.element_size() for t in _tensors(args[1])) * size
        if name == "scatter_" and not nbytes:
            nbytes = sum(t.numel() * t.element_size() for t in _tensors(args[0])) * size
        first = tensors[0] if tensors else None
        seq_key = (group, public if public in P2P_OPS else "")
        with self._lock:
            counter = self._seq.setdefault(seq_key, itertools.count())
            seq = next(counter)
        call = CallRecord(
            op=public,
            c10d_op=name,
            group=group,
            group_size=size,
            bytes=int(nbytes),
            dtype=str(first.dtype).removeprefix("torch.") if first is not None else "",
            seq=seq,
            start=start,
            thread=threading.get_ident(),
            in_backward=torch._C._current_graph_task_id() != -1,
            device=first.device.type if first is not None else "cpu",
            group_ranks=ranks,
        )
        work = out[-1] if isinstance(out, (tuple, list)) else out
        try:
            work = _unbox(torch._C._distributed_c10d.Work, work)
        except Exception:
            pass
        if synchronous:
            call.end = time.time()
            if call.thread == self.main_thread and call.device == "cpu":  # NCCL only syncs streams
                self.blocked.append((start, call.end))
        self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)
        if not synchronous:
            self._watch(call, work)

    def _watch(self, call: CallRecord, work: Any) -> None:
        # On CUDA the future completes when the NCCL kernel is enqueued, so this end is
        # host-side only; the probe replaces it with kernel time (probes/comm/cuda_timing.py).
        try:
            fut = work.get_future()
        except Exception:  # gloo's reduce-scatter and send/recv works have no future
            # Keep the work object alive: pybind then hands the same Python object to the
            # caller, so a later Python-level wait() finds it by id.
            with self._lock:
                self._pending[id(work)] = (work, call)
                if len(self._pending) > 10_000:
                    self._pending.pop(next(iter(self._pending)))
            return

        def done(_: Any, call: CallRecord = call) -> None:
            call.end = time.time()

        fut.add_done_callback(done)

    def _waited(self, work: Any, t0: float, t1: float) -> None:
        with self._lock:
            entry = self._pending.pop(id(work), None)
        if entry is not None and entry[1].end is None:
            entry[1].end = t1
        if threading.get_ident() == self.main_thread:
            self.blocked.append((t0, t1))

    def poll(self, now: float) -> None:
        """Stamp ``now`` as the end of future-less works that completed since the last poll.

        Works waited from C++ (FSDP2's reduce-scatter on gloo) are only seen here, so their
        end is late by at most the time since the last poll (the probe polls at each phase).
        """
        if not self._pending:
            return
        with self._lock:
            items = list(self._pending.items())
        for key, (work, call) in items:
            try:
                completed = work.is_completed()
            except Exception:
                completed = True
            if completed:
                if call.end is None:
                    call.end = now
                with self._lock:
                    self._pending.pop(key, None)

    def drain(self) -> list[CallRecord]:
        """Remove and return every recorded call (complete or not), oldest first."""
        out: list[CallRecord] = []
        while self.calls:
            out.append(self.calls.popleft())
        return out

    def drain_blocked(self) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        while self.blocked:
            out.append(self.blocked.popleft())
        return out
