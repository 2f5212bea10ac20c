"""The CUDA view of memory: the caching allocator's counters and the allocation history.

NVML (memory used by the device and by this process) is read through the one wrapper,
``advisor.probes.device.nvml.Nvml``.
"""

from __future__ import annotations

import os
import sys


ALLOCATOR_BLOCK = 512  # bytes: CUDA's caching allocator rounds every request up to a multiple (kMinBlockSize)


def allocator_block_bytes(nbytes: int) -> int:
    """The bytes CUDA's caching allocator hands out for a request of ``nbytes`` (and counts in
    ``memory_allocated``): a multiple of 512, at least 512 (``CUDACachingAllocator.cpp``'s
    ``round_size`` without ``roundup_power2_divisions``). Pure: ``advisor fit`` sizes a fake
    device's storages with it."""
    return max(ALLOCATOR_BLOCK, -(-nbytes // ALLOCATOR_BLOCK) * ALLOCATOR_BLOCK)


def device_uuid(index: int) -> str | None:
    """NVML-style UUID ("GPU-...") of CUDA device ``index`` (``get_device_properties().uuid``)."""
    import torch

    try:
        raw = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:
        return None
    return raw if raw.startswith("GPU-") else f"GPU-{raw}"


def allocator_counters(index: int) -> dict[str, int]:
    """The caching allocator's counters for one device from one read of its statistics, bytes and
    counts: ``allocated_bytes``, ``reserved_bytes`` (now), ``peak_allocated_bytes`` (since the
    last ``reset_peak_memory_stats``), ``alloc_retries`` (cudaMalloc failures that forced a cache
    flush and retry), ``num_ooms``.

    One ``torch.cuda.memory_stats_as_nested_dict`` (the C++ dict as it is): ``memory_allocated``,
    ``memory_reserved`` and ``max_memory_allocated`` each flatten every statistic into a new dict
    in Python, 0.4 ms a call on an H200's host; the light path's ten calls a step made a 2.6 ms
    step 1.9 times as long."""
    import torch

    stats = torch.cuda.memory_stats_as_nested_dict(index)

    def stat(key: str, field: str = "current") -> int:
        return int(((stats.get(key) or {}).get("all") or {}).get(field, 0))

    return {
        "allocated_bytes": stat("allocated_bytes"),
        "reserved_bytes": stat("reserved_bytes"),
        "peak_allocated_bytes": stat("allocated_bytes", "peak"),
        "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
    }


def allocator_view(index: int) -> dict[str, int]:
    """The caching allocator's counters for one device, bytes and counts (``allocator_counters``)
    and ``reserved_minus_allocated_bytes``, the cache no tensor uses."""
    counters = allocator_counters(index)
    return {
        "allocated_bytes": counters["allocated_bytes"],
        "reserved_bytes": counters["reserved_bytes"],
        "reserved_minus_allocated_bytes": counters["reserved_bytes"] - counters["allocated_bytes"],
        "alloc_retries": counters["alloc_retries"],
        "num_ooms": counters["num_ooms"],
    }


def start_memory_history(max_entries: int = 100_000) -> bool:
    """Start PyTorch's allocation history (for the OOM snapshot); False where CUDA lacks it.

    Python-only stacks keep the cost down (C++ unwinding is the slow part); ``max_entries`` bounds
    the ring buffer. Private API ``torch.cuda.memory._record_memory_history``, documented in
    https://pytorch.org/docs/stable/torch_cuda_memory.html.
    """
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=max_entries
        )
    except Exception:
        return False
    return True


def stop_memory_history() -> None:
    import torch

    if torch.cuda.is_available():
        try:
            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            pass


def dump_snapshot(folder: str) -> str | None:
    """Pickle ``torch.cuda.memory._snapshot()`` into ``folder``; returns the path or None.

    The pickle is what https://pytorch.org/memory_viz reads. It is written locally and never
    sent over the socket (the controller only receives the path).
    """
    import pickle

    import torch

    if not torch.cuda.is_available():
        return None
    try:
        snapshot = torch.cuda.memory._snapshot()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"oom-snapshot-{os.getpid()}.pickle")
        with open(path, "wb") as fh:
            pickle.dump(snapshot, fh)
    except Exception as exc:  # the process is dying of OOM already: report, never raise
        print(f"advisor: could not write the CUDA memory snapshot: {exc}", file=sys.stderr)
        return None
    return path
