"""Storages the advisor itself holds in host memory for an offload remedy (torch-free).

The offload appliers (``apply/remedies/activation_offload.py`` and ``optimizer_offload.py``)
register the key of every host storage they allocate (``untyped_storage()._cdata``, the key the
memory tracker uses) and drop it when they free the storage. The memory tracker classifies those
storages as ``offloaded_host`` (``MEMORY_CATEGORIES``) and never counts them against a device
budget. Living here, in records, lets probes and apply share it without importing each other.
"""

from __future__ import annotations

import threading
from typing import Callable

_lock = threading.Lock()
_keys: dict[int, int] = {}  # storage key -> nbytes
# Called with a key when it is registered or dropped: the tracker saw the allocation first (as a
# temporary) and re-classifies it at once.
listeners: list[Callable[[int], None]] = []


def register(key: int, nbytes: int) -> None:
    """Mark one host storage (``untyped_storage()._cdata``) of ``nbytes`` bytes as the advisor's."""
    with _lock:
        _keys[int(key)] = int(nbytes)
    _notify(int(key))


def unregister(key: int) -> None:
    with _lock:
        _keys.pop(int(key), None)
    _notify(int(key))


def _notify(key: int) -> None:
    for listener in list(listeners):
        listener(key)


def is_offloaded(key: int) -> bool:
    """True when ``key`` is a host storage an offload remedy holds."""
    return key in _keys


def held_bytes() -> int:
    """Bytes of host memory the offload remedies hold now (source: their own registrations)."""
    with _lock:
        return sum(_keys.values())


# Why a remedy that moves device memory to the host cannot help a CPU-only job: its "device" memory
# is host memory (applied to a public script, the process's real peak rose 203 MB while the tracker
# read a 55.7 MB drop). Said by the offload appliers' checks and, for the restart remedy with no
# applier, by the recommender.
NO_ACCELERATOR = "the job runs on the CPU: its memory is host memory already, so moving it to the host frees none"
