"""The CUDA view of memory: the caching allocator's counters and the allocation history.

NVML (memory used by the device and by this process) is read through the one wrapper,
``advisor.probes.device.nvml.Nvml``.
"""

from __future__ import annotations

import os
import sys


def device_uuid(index: int) -> str | None:
    """NVML-style UUID ("GPU-...") of CUDA device ``index`` (``get_device_properties().uuid``)."""
    import torch

    try:
        raw = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:
        return None
    return raw if raw.startswith("GPU-") else f"GPU-{raw}"


def allocator_view(index: int) -> dict[str, int]:
    """The caching allocator's counters for one device, bytes and counts.

    ``allocated_bytes``: ``torch.cuda.memory_allocated``; ``reserved_bytes``:
    ``torch.cuda.memory_reserved``; ``alloc_retries``: ``memory_stats()["num_alloc_retries"]``
    (cudaMalloc failures that forced a cache flush and retry); ``num_ooms``: ``"num_ooms"``.
    """
    import torch

    stats = torch.cuda.memory_stats(index)
    allocated = int(torch.cuda.memory_allocated(index))
    reserved = int(torch.cuda.memory_reserved(index))
    return {
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        "reserved_minus_allocated_bytes": reserved - allocated,
        "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
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
