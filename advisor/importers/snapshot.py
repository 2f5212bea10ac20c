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
Block = tuple[int, tuple]  # (size, frames)


def _frames(value: Any) -> tuple:
    out = []
    for f in value if isinstance(value, list) else []:
        if isinstance(f, Mapping):
            out.append((str(f.get("filename", "")), f.get("line") if isinstance(f.get("line"), int) else 0,
                        str(f.get("name", ""))))
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


def _site(frames: Sequence[tuple[str, int, str]]) -> str:
    """The innermost frame in the user's code (outside torch and C++), else the innermost frame."""
    for filename, line, name in frames:
        norm = filename.replace("\\", "/")
        if norm.endswith(".py") and "/torch/" not in norm and "site-packages/" not in norm:
            return f"{filename}:{line} in {name}"
    if frames:
        filename, line, name = frames[0]
        return f"{filename}:{line} in {name}"
    return "(no stack recorded)"


def _pick_device(segments: list[Mapping[str, Any]], traces: list[Any]) -> int:
    reserved: dict[int, int] = defaultdict(int)
    for seg in segments:
        reserved[int(seg.get("device", 0) or 0)] += int(seg.get("total_size", 0) or 0)
    for index, trace in enumerate(traces):
        if trace and index not in reserved:
            reserved[index] = 0
    return max(reserved, key=lambda d: (reserved[d], -d)) if reserved else 0


def analyze(snapshot: Any) -> dict[str, Any]:
    """The allocator view and categories at the peak of one snapshot dict (plain data in, out)."""
    if isinstance(snapshot, list):  # torch.cuda.memory_snapshot(): the segments alone
        snapshot = {"segments": snapshot}
    if not isinstance(snapshot, Mapping) or not isinstance(snapshot.get("segments"), list):
        raise ValueError("not a CUDA memory snapshot: no 'segments' list (expected the pickle written by "
                         "torch.cuda.memory._dump_snapshot)")
    segments = [s for s in snapshot["segments"] if isinstance(s, Mapping)]
    traces = snapshot.get("device_traces") if isinstance(snapshot.get("device_traces"), list) else []
    device = _pick_device(segments, traces)
    segments = [s for s in segments if int(s.get("device", 0) or 0) == device]
    trace = [e for e in (traces[device] if device < len(traces) and isinstance(traces[device], list) else [])
             if isinstance(e, Mapping)]
    end: dict[int, Block] = {}
    for seg in segments:
        for block in seg.get("blocks") or []:
            # A block freed on another stream's behalf stays allocated until its free completes.
            if isinstance(block, Mapping) and block.get("state") in LIVE_STATES:
                end[int(block.get("address", 0) or 0)] = (int(block.get("size", 0) or 0), _frames(block.get("frames")))
    reserved_end = sum(int(s.get("total_size", 0) or 0) for s in segments)
    actions = {str(e.get("action")) for e in trace}
    free_action = "free_completed" if "free_completed" in actions else "free_requested"
    # Backwards from the final state: the blocks live when the trace began.
    live = dict(end)
    reserved = reserved_end
    for e in reversed(trace):
        action, addr, size = str(e.get("action")), int(e.get("addr", 0) or 0), int(e.get("size", 0) or 0)
        if action == "alloc":
            live.pop(addr, None)
        elif action == free_action:
            live[addr] = (size, _frames(e.get("frames")))
        elif action in ("segment_alloc", "segment_map"):
            reserved -= size
        elif action in ("segment_free", "segment_unmap"):
            reserved += size
    start_live = dict(live)
    total = sum(size for size, _ in live.values())
    peak, peak_at, peak_reserved = total, -1, reserved
    for i, e in enumerate(trace):  # forwards: the allocated total after every action
        action, size = str(e.get("action")), int(e.get("size", 0) or 0)
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
    for e in trace[: peak_at + 1]:  # replay again up to the peak for the live blocks there
        action, addr, size = str(e.get("action")), int(e.get("addr", 0) or 0), int(e.get("size", 0) or 0)
        if action == "alloc":
            live[addr] = (size, _frames(e.get("frames")))
        elif action == free_action:
            live.pop(addr, None)
    categories = dict.fromkeys(MEMORY_CATEGORIES, 0)
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for addr, (size, frames) in live.items():
        categories[classify(frames, held_at_end=addr in end)] += size
        site = sites[_site(frames)]
        site[0] += size
        site[1] += 1
    top = sorted(sites.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_SITES]
    ooms = [e for e in trace if e.get("action") == "oom"]
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
        "oom": ({"requested_bytes": int(ooms[-1].get("size", 0) or 0),
                 "device_free_bytes": ooms[-1].get("device_free"),
                 "frames": [{"file": f, "line": n, "function": fn, "code": ""} for f, n, fn in
                            _frames(ooms[-1].get("frames"))[:8]]} if ooms else None),
    }


def import_snapshot(path: Path, *, step: int = 0, with_run: bool = True) -> ImportResult:
    """Records of one snapshot file; ``step`` places its peak in a session that has steps."""
    view = analyze(load_plain(path))
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
