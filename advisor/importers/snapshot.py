"""CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) -> memory records.

The snapshot is the allocator's state at the dump (``segments`` with their ``blocks``) plus,
when ``_record_memory_history`` was on, each device's trace of allocator actions
(``device_traces``: ``alloc``, ``free_completed``, ``segment_alloc``, ``segment_free``, ``oom``,
each with ``addr``, ``size`` and the allocating stack ``frames``). The peak is found by replaying
the trace: walked backwards from the final state it gives the blocks live when the trace began,
walked forwards the allocated total at every action. At the peak:

- allocated bytes (the live blocks), reserved bytes (the segments), and their difference, the
  fragmentation (``1 - allocated / reserved``);
- bytes by category, from each live block's stack frames (``classify``): ``torch/optim`` ->
  optimizer state; autograd's ``AccumulateGrad`` -> gradient; other backward frames ->
  gradient if the block is still held at the dump, else temporary; module ``forward`` ->
  activation; parameter creation and ``Module.to``/``cuda`` -> parameter; ``torch/utils/data``
  -> input; anything else (or no frames) -> other;
- the top allocation sites: live bytes grouped by the innermost frame outside torch.

The file is loaded by ``safe_pickle.load_plain`` (no global is ever resolved); unknown keys
are ignored.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from advisor.importers.limits import MAX_DEVICES, MAX_FRAMES, MAX_INT, MAX_SNAPSHOT_ITEMS, LimitError, bounded_int
from advisor.importers.result import ImportResult
from advisor.importers.safe_pickle import load_plain
from advisor.records.samples import (
    MEMORY_CATEGORIES,
    Event,
    ExitInfo,
    MemorySample,
    RunInfo,
)

TOP_SITES = 10
LIVE_STATES = frozenset({"active_allocated", "active_pending_free", "active_awaiting_free"})
MAX_SITE = 400  # characters of one allocation site's text
Frame = tuple[str, int, str]  # (filename, line, name)
Block = tuple[int, tuple[Frame, ...]]  # (size, frames)


def _frames(value: Any) -> tuple[Frame, ...]:
    """(filename, line, name) of each frame dict; wrong-typed fields read as empty, never as the
    text of whatever object is there (a list repeated through the memo made a 100 GB string)."""
    out = []
    for f in value[:MAX_FRAMES] if isinstance(value, list) else ():
        if isinstance(f, Mapping):
            filename, line, name = f.get("filename"), f.get("line"), f.get("name")
            out.append((filename if isinstance(filename, str) else "",
                        line if type(line) is int and 0 <= line <= MAX_INT else 0,
                        name if isinstance(name, str) else ""))
    return tuple(out)


def classify(frames: Sequence[Any], *, held_at_end: bool = False) -> str:
    """The memory category of an allocation made under ``frames`` (the snapshot's frame dicts, or
    (filename, line, name) tuples)."""
    if frames and isinstance(frames[0], Mapping):
        frames = _frames(list(frames))
    files = [f[0].replace("\\", "/") for f in frames]
    names = [f[2] for f in frames]
    text = " ".join(names).lower()
    if any("torch/optim/" in f for f in files):
        return "optimizer_state"
    if "accumulategrad" in text or "accumulate_grad" in text:
        return "gradient"
    backward = any(
        ("torch/autograd/" in f and n in ("backward", "_engine_run_backward")) or
        (f.endswith("torch/_tensor.py") and n == "backward") for f, n in zip(files, names)
    ) or "autograd::engine" in text or "evaluate_function" in text
    if backward:
        return "gradient" if held_at_end else "temporary"
    if any(f.endswith("torch/nn/parameter.py") for f in files) or any(
            "torch/nn/modules/" in f and n in ("_apply", "to", "cuda", "convert", "reset_parameters",
                                               "__init__", "load_state_dict", "_load_from_state_dict")
            for f, n in zip(files, names)):
        return "parameter"
    if any("torch/nn/modules/" in f and n in ("forward", "_call_impl", "_wrapped_call_impl")
           for f, n in zip(files, names)) or "forward" in names:
        return "activation"
    if any("torch/utils/data/" in f or "pin_memory" in n for f, n in zip(files, names)):
        return "input"
    return "other"


def _site(frames: Sequence[Frame]) -> str:
    """The innermost frame in the user's code (outside torch and C++), else the innermost frame."""
    for filename, line, name in frames:
        norm = filename.replace("\\", "/")
        if norm.endswith(".py") and "/torch/" not in norm and "site-packages/" not in norm:
            return f"{filename}:{line} in {name}"[:MAX_SITE]
    if frames:
        filename, line, name = frames[0]
        return f"{filename}:{line} in {name}"[:MAX_SITE]
    return "(no stack recorded)"


class _Walk:
    """One pass over the snapshot's plain data: types checked, every item visited counted against
    a budget, each stack's frames read once (a list the memo repeats is the same object)."""

    def __init__(self, budget: int) -> None:
        self.left = budget
        self._stacks: dict[int, tuple[Frame, ...]] = {}

    def items(self, value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise ValueError(f"{where} is a {type(value).__name__}, not a list")
        self.left -= len(value)
        if self.left < 0:
            raise LimitError(f"the snapshot's {where} and what came before hold more items than the importer "
                             "visits (its lists repeat themselves, or the snapshot is too large)")
        return value

    def number(self, entry: Mapping[str, Any], key: str, where: str, high: int = MAX_INT) -> int:
        value = entry.get(key)
        if value is None:
            return 0
        if type(value) is not int or not 0 <= value <= high:
            shown = type(value).__name__ if type(value) is not int else ("too large" if value > 0 else "negative")
            raise ValueError(f"{where}.{key} is {shown}, not a whole number up to {high}")
        return value

    def stack(self, value: Any) -> tuple[Frame, ...]:
        if not isinstance(value, list):
            return ()
        found = self._stacks.get(id(value))  # the snapshot holds every list alive: ids are stable
        if found is None:
            self.left -= min(len(value), MAX_FRAMES)
            if self.left < 0:
                raise LimitError("the snapshot's stacks hold more frames than the importer visits")
            found = self._stacks[id(value)] = _frames(value)
        return found


def _pick_device(reserved_by: dict[int, int], traces: list[Any]) -> int:
    reserved = dict(reserved_by)
    for index, trace in enumerate(traces[:MAX_DEVICES]):
        if trace and index not in reserved:
            reserved[index] = 0
    return max(reserved, key=lambda d: (reserved[d], -d)) if reserved else 0


def analyze(snapshot: Any, *, budget: int = MAX_SNAPSHOT_ITEMS) -> dict[str, Any]:
    """The allocator view and categories at the peak of one snapshot dict (plain data in, out).

    ``budget``: how many segments, blocks, trace entries and frames it visits at most
    (``LimitError`` past it); a field of the wrong type is a ``ValueError`` naming it.
    """
    if isinstance(snapshot, list):  # torch.cuda.memory_snapshot(): the segments alone
        snapshot = {"segments": snapshot}
    if not isinstance(snapshot, Mapping) or not isinstance(snapshot.get("segments"), list):
        raise ValueError("not a CUDA memory snapshot: no 'segments' list (expected the pickle written by "
                         "torch.cuda.memory._dump_snapshot)")
    walk = _Walk(budget)
    segments = [s for s in walk.items(snapshot["segments"], "segments") if isinstance(s, Mapping)]
    traces = walk.items(snapshot.get("device_traces") if isinstance(snapshot.get("device_traces"), list) else None,
                        "device_traces")
    reserved_by: dict[int, int] = defaultdict(int)
    for i, seg in enumerate(segments):
        device = walk.number(seg, "device", f"segments[{i}]", high=MAX_DEVICES - 1)
        reserved_by[device] += walk.number(seg, "total_size", f"segments[{i}]")
    device = _pick_device(reserved_by, traces)
    segments = [s for s in segments if (s.get("device") or 0) == device]
    raw_trace = traces[device] if device < len(traces) and isinstance(traces[device], list) else []
    trace: list[tuple[str, int, int, Mapping[str, Any]]] = []  # (action, addr, size, the entry)
    for i, e in enumerate(walk.items(raw_trace, f"device_traces[{device}]")):
        if isinstance(e, Mapping):
            action = e.get("action")
            where = f"device_traces[{device}][{i}]"
            trace.append((action if isinstance(action, str) else "", walk.number(e, "addr", where),
                          walk.number(e, "size", where), e))
    end: dict[int, Block] = {}
    for i, seg in enumerate(segments):
        for j, block in enumerate(walk.items(seg.get("blocks"), f"segments[{i}].blocks")):
            # A block freed on another stream's behalf stays allocated until its free completes.
            if isinstance(block, Mapping) and isinstance(block.get("state"), str) and block["state"] in LIVE_STATES:
                where = f"segments[{i}].blocks[{j}]"
                end[walk.number(block, "address", where)] = (walk.number(block, "size", where),
                                                             walk.stack(block.get("frames")))
    reserved_end = sum(walk.number(s, "total_size", "segment") for s in segments)
    actions = {action for action, _, _, _ in trace}
    free_action = "free_completed" if "free_completed" in actions else "free_requested"
    # Backwards from the final state: the blocks live when the trace began.
    live = dict(end)
    reserved = reserved_end
    for action, addr, size, entry in reversed(trace):
        if action == "alloc":
            live.pop(addr, None)
        elif action == free_action:
            live[addr] = (size, walk.stack(entry.get("frames")))
        elif action in ("segment_alloc", "segment_map"):
            reserved -= size
        elif action in ("segment_free", "segment_unmap"):
            reserved += size
    start_live = dict(live)
    total = sum(size for size, _ in live.values())
    peak, peak_at, peak_reserved = total, -1, reserved
    for i, (action, _, size, _) in enumerate(trace):  # forwards: the allocated total after every action
        if action == "alloc":
            total += size
        elif action == free_action:
            total -= size
        elif action in ("segment_alloc", "segment_map"):
            reserved += size
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
        if total > peak:
            peak, peak_at, peak_reserved = total, i, reserved
    if not trace:
        peak, peak_reserved = total, reserved_end
    live = start_live
    for action, addr, size, entry in trace[: peak_at + 1]:  # replay again up to the peak for the live blocks there
        if action == "alloc":
            live[addr] = (size, walk.stack(entry.get("frames")))
        elif action == free_action:
            live.pop(addr, None)
    categories = dict.fromkeys(MEMORY_CATEGORIES, 0)
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    known: dict[tuple[int, bool], tuple[str, str]] = {}  # (stack, held at the end) -> (category, site)
    for addr, (size, frames) in live.items():
        key = (id(frames), addr in end)
        found = known.get(key)
        if found is None:  # one stack is classified once, however many blocks share it
            found = known[key] = (classify(frames, held_at_end=key[1]), _site(frames))
        categories[found[0]] += size
        site = sites[found[1]]
        site[0] += size
        site[1] += 1
    top = sorted(sites.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_SITES]
    oom = next((entry for action, _, _, entry in reversed(trace) if action == "oom"), None)
    return {
        "device": device,
        "peak_allocated_bytes": peak,
        "peak_reserved_bytes": peak_reserved,
        "reserved_minus_allocated_bytes": max(0, peak_reserved - peak),
        "fragmentation": (1 - peak / peak_reserved) if peak_reserved > 0 else None,
        "end_allocated_bytes": sum(size for size, _ in end.values()),
        "end_reserved_bytes": reserved_end,
        "categories_at_peak": categories,
        "top_sites": [{"site": s, "bytes": b, "blocks": n} for s, (b, n) in top],
        "segments": len(segments),
        "trace_entries": len(trace),
        "peak_index": peak_at,
        "oom": ({"requested_bytes": walk.number(oom, "size", "oom"),
                 "device_free_bytes": bounded_int(oom.get("device_free")),
                 "frames": [{"file": f, "line": n, "function": fn, "code": ""} for f, n, fn in
                            walk.stack(oom.get("frames"))[:8]]} if oom is not None else None),
    }


def import_snapshot(path: Path, *, step: int = 0, with_run: bool = True) -> ImportResult:
    """Records of one snapshot file; ``step`` places its peak in a session that has steps."""
    data = load_plain(path)
    # What a snapshot's own bytes can hold, with room: a file that makes the walk visit far more
    # items than it has bytes repeats itself through the memo.
    budget = min(MAX_SNAPSHOT_ITEMS, max(1_000_000, 2 * path.stat().st_size))
    view = analyze(data, budget=budget)
    result = ImportResult()
    if with_run:
        result.records.append(RunInfo(script=str(path), argv=[], device={
            "type": "cuda", "name": None, "index": view["device"], "memory_capacity": None},
            config={"imported_from": "cuda_memory_snapshot", "files": [str(path)]}))
    categories = view["categories_at_peak"]
    result.records.append(MemorySample(
        rank=0, step=step, time=0.0, event="snapshot_peak", categories=categories,
        total_bytes=view["peak_allocated_bytes"], allocated_bytes=view["peak_allocated_bytes"],
        reserved_bytes=view["peak_reserved_bytes"]))
    result.records.append(Event(rank=0, step=step, name="cuda_memory", data={
        "reserved_minus_allocated_bytes": view["reserved_minus_allocated_bytes"]}))
    result.records.append(Event(rank=0, step=step, name="memory_snapshot",
                                data={"file": str(path), **{k: v for k, v in view.items() if k != "oom"}}))
    if view["oom"] is not None:
        result.records.append(Event(rank=0, step=step, name="oom", data={
            "requested_bytes": view["oom"]["requested_bytes"], "categories": categories,
            "frames": view["oom"]["frames"], "op": None, "module": None, "snapshot_path": str(path)}))
    if with_run:
        result.records.append(ExitInfo(rank=0, code=0, reason=f"imported CUDA memory snapshot {path.name}"))
    notes = result.notes
    notes.append("memory snapshot: no step times, phases, ops or collectives, so no time advice "
                 "(import a Kineto trace of the same run with it)")
    notes.append("memory snapshot: categories come from allocation stack frames, and there are no per-module "
                 "activation bytes, so no checkpointing plan")
    if not view["trace_entries"]:
        notes.append("memory snapshot: no allocation history (_record_memory_history was off), so the 'peak' is "
                     "the state at the dump and blocks carry no stacks")
    result.summary = {"snapshot": str(path), "peak_allocated_bytes": view["peak_allocated_bytes"],
                      "peak_reserved_bytes": view["peak_reserved_bytes"], "trace_entries": view["trace_entries"]}
    return result
