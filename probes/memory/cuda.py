"""The CUDA view of memory: the caching allocator's counters, NVML, the allocation history.

NVML is wrapped the way nvitop's ``libnvml`` does it: one object imports ``pynvml`` and calls
``nvmlInit`` lazily, once; every NVML failure (package missing, no driver, no device, field not
supported) becomes ``None`` instead of an exception, so memory probing never breaks training.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any, Callable


def _import_pynvml() -> ModuleType:
    import pynvml  # nvidia-ml-py; importable without a driver, nvmlInit then raises

    return pynvml


class Nvml:
    """Lazy, failure-tolerant NVML access. ``loader`` returns the pynvml module (a fake in tests)."""

    def __init__(self, loader: Callable[[], ModuleType] = _import_pynvml) -> None:
        self._loader = loader
        self._lib: ModuleType | None = None
        self._tried = False
        self.status = "not initialised"  # then "ok", "package missing", "no driver: ..."

    def _get(self) -> ModuleType | None:
        if not self._tried:
            self._tried = True
            try:
                lib = self._loader()
            except ImportError:
                self.status = "package missing"
                return None
            try:
                lib.nvmlInit()
            except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
                self.status = f"no driver: {exc}"
                return None
            self._lib = lib
            self.status = "ok"
        return self._lib

    def device_count(self) -> int | None:
        """Devices NVML sees (``nvmlDeviceGetCount``), or None when NVML is unusable."""
        lib = self._get()
        if lib is None:
            return None
        try:
            return int(lib.nvmlDeviceGetCount())
        except Exception:
            return None

    def _handle(self, index: int, uuid: str | None) -> Any:
        lib = self._get()
        if lib is None:
            return None
        if uuid:
            try:
                return lib.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:
                pass  # fall back to the index (right unless CUDA_VISIBLE_DEVICES reorders)
        count = self.device_count()
        if count is None or index >= count:
            return None
        try:
            return lib.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            return None

    def device_used_bytes(self, index: int, uuid: str | None = None) -> int | None:
        """Device memory in use by all processes, bytes (``nvmlDeviceGetMemoryInfo(h).used``)."""
        handle = self._handle(index, uuid)
        if handle is None:
            return None
        try:
            return int(self._lib.nvmlDeviceGetMemoryInfo(handle).used)  # type: ignore[union-attr]
        except Exception:
            return None

    def process_used_bytes(self, index: int, pid: int, uuid: str | None = None) -> int | None:
        """Device memory used by process ``pid``, bytes (``nvmlDeviceGetComputeRunningProcesses``).

        None when NVML cannot say (no such process listed, or the field is unavailable, as it is
        inside some containers).
        """
        handle = self._handle(index, uuid)
        if handle is None:
            return None
        try:
            procs = self._lib.nvmlDeviceGetComputeRunningProcesses(handle)  # type: ignore[union-attr]
        except Exception:
            return None
        for proc in procs:
            if int(getattr(proc, "pid", -1)) == pid:
                used = getattr(proc, "usedGpuMemory", None)
                return int(used) if isinstance(used, int) else None
        return None


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
