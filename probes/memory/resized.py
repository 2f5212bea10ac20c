"""FSDP2 frees and re-allocates its gathered parameters by resizing their storage, which a
dispatch mode does not see: this makes those resizes visible to the storage tracker.

FSDP2 (``torch.distributed.fsdp.fully_shard``) keeps one storage per unsharded parameter for the
module's lifetime and calls ``free_storage`` (``untyped_storage().resize_(0)``) after forward or
backward and ``alloc_storage`` (resize back) before the next all-gather. Neither is an aten op,
and the storage object stays alive, so the tracker's ``weakref.finalize`` never fires: without
this watch the gathered parameters count as alive all the time (about the whole model's
parameter bytes too many under ZeRO-3). ``ResizeWatch`` wraps those two module-level functions
of FSDP2 (private, torch 2.11-2.13: ``_fully_shard._fsdp_param`` defines them,
``_fsdp_param_group`` imports ``alloc_storage``) while tracking is on and restores them after;
where they are missing it does nothing. Re-check on torch upgrades.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

MODULES = ("torch.distributed.fsdp._fully_shard._fsdp_param", "torch.distributed.fsdp._fully_shard._fsdp_param_group")


class ResizeWatch:
    """Calls ``on_free(tensor)`` before FSDP2 frees a storage and ``on_alloc(tensor)`` after it
    re-allocates one, while started."""

    def __init__(self, on_free: Callable[[Any], None], on_alloc: Callable[[Any], None]) -> None:
        self.on_free, self.on_alloc = on_free, on_alloc
        self._saved: list[tuple[Any, str, Any]] = []

    def ensure(self) -> None:
        """Install the wrappers in the FSDP2 modules imported so far (cheap when done)."""
        done = {(id(m), name) for m, name, _ in self._saved}
        for module_name in MODULES:
            module = sys.modules.get(module_name)
            if module is None:
                continue
            for name, wrap in (("free_storage", self._free), ("alloc_storage", self._alloc)):
                original = getattr(module, name, None)
                if original is None or (id(module), name) in done or getattr(original, "_advisor_watch", False):
                    continue
                wrapped = wrap(original)
                wrapped._advisor_watch = True  # type: ignore[attr-defined]
                setattr(module, name, wrapped)
                self._saved.append((module, name, original))

    def stop(self) -> None:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()

    def _free(self, original: Callable[[Any], None]) -> Callable[[Any], None]:
        def free_storage(tensor: Any) -> None:
            self.on_free(tensor)
            original(tensor)

        return free_storage

    def _alloc(self, original: Callable[[Any], None]) -> Callable[[Any], None]:
        def alloc_storage(tensor: Any) -> None:
            original(tensor)
            self.on_alloc(tensor)

        return alloc_storage
