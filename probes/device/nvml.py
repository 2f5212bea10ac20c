"""The one module that imports pynvml: lazy, initialised once, errors become None.

Both the device spec (name, capacity, driver) and the memory probe (memory used by the device
and by this process) read NVML through this wrapper.

States handled (each tested with a fake NVML): the package is missing, the
driver is missing (``nvmlInit`` fails), there are no devices, and a field is
not supported on this device. None of them raises; each query returns None.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any, Callable


def _import_pynvml() -> ModuleType:
    return importlib.import_module("pynvml")


class Nvml:
    """Lazy NVML reader. ``loader`` returns the pynvml module (tests pass a fake)."""

    def __init__(self, loader: Callable[[], ModuleType] = _import_pynvml) -> None:
        self._loader = loader
        self._lock = threading.Lock()
        self._lib: ModuleType | None = None
        self._tried = False
        self.error: str | None = None  # why NVML is unavailable, for messages
        self.status = "not initialised"  # then "ok", "package missing" or "no driver: ..."

    def _library(self) -> ModuleType | None:
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    lib = self._loader()
                except ImportError as exc:
                    self.error = f"pynvml is not installed ({exc})"
                    self.status = "package missing"
                    return None
                try:
                    lib.nvmlInit()
                except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                    self.error = f"NVML could not start: {exc}"
                    self.status = f"no driver: {exc}"
                    return None
                self._lib = lib
                self.status = "ok"
            return self._lib

    def _call(self, fn: str, *args: Any) -> Any:
        lib = self._library()
        if lib is None:
            return None
        try:
            return getattr(lib, fn)(*args)
        except Exception:  # NVMLError_NotSupported, InvalidArgument, ... -> no value
            return None

    def available(self) -> bool:
        return self._library() is not None

    def device_count(self) -> int | None:
        """``nvmlDeviceGetCount``: visible devices (count), None without NVML."""
        return self._call("nvmlDeviceGetCount")

    def _handle(self, index: int, uuid: str | None) -> Any:
        if uuid:
            handle = self._call("nvmlDeviceGetHandleByUUID", uuid)
            if handle is not None:
                return handle  # else the index (right unless CUDA_VISIBLE_DEVICES reorders)
        count = self.device_count()
        if count is not None and index >= count:
            return None
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def device_name(self, index: int = 0, uuid: str | None = None) -> str | None:
        """``nvmlDeviceGetName``: the marketing name, e.g. "NVIDIA H200"."""
        handle = self._handle(index, uuid)
        name = self._call("nvmlDeviceGetName", handle) if handle is not None else None
        return name.decode() if isinstance(name, bytes) else name

    def memory_total(self, index: int = 0, uuid: str | None = None) -> int | None:
        """``nvmlDeviceGetMemoryInfo(handle).total``: device memory, bytes."""
        handle = self._handle(index, uuid)
        info = self._call("nvmlDeviceGetMemoryInfo", handle) if handle is not None else None
        return int(info.total) if info is not None else None

    def device_used_bytes(self, index: int = 0, uuid: str | None = None) -> int | None:
        """``nvmlDeviceGetMemoryInfo(handle).used``: device memory in use by all processes, bytes."""
        handle = self._handle(index, uuid)
        info = self._call("nvmlDeviceGetMemoryInfo", handle) if handle is not None else None
        return int(info.used) if info is not None else None

    def process_used_bytes(self, index: int, pid: int, uuid: str | None = None) -> int | None:
        """Device memory used by process ``pid``, bytes (``nvmlDeviceGetComputeRunningProcesses``).

        None when NVML cannot say (no such process listed, or the field is unavailable, as it is
        inside some containers).
        """
        handle = self._handle(index, uuid)
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", handle) if handle is not None else None
        for proc in procs or ():
            if int(getattr(proc, "pid", -1)) == pid:
                used = getattr(proc, "usedGpuMemory", None)
                return int(used) if isinstance(used, int) else None
        return None

    def driver_version(self) -> str | None:
        """``nvmlSystemGetDriverVersion``: e.g. "580.65.06"."""
        version = self._call("nvmlSystemGetDriverVersion")
        return version.decode() if isinstance(version, bytes) else version


_default: Nvml | None = None


def default() -> Nvml:
    """The process-wide reader, created on first use."""
    global _default
    if _default is None:
        _default = Nvml()
    return _default
