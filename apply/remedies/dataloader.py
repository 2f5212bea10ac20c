"""The script's DataLoader tuned live, the applier half.

Settings (``num_workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``) are set
on the very DataLoader object the script built (PYTORCH-NOTES: they take effect at the next
``iter()``; ``persistent_workers`` is guarded by ``DataLoader.__setattr__`` and set past it).
To take effect at once, the iterator the script's loop holds is restarted in place:

1. its outstanding batches are drained, in order (a multi-process iterator has prefetched some),
   and its workers shut down (persistent ones too: PYTORCH-NOTES);
2. a new iterator is built with the new settings on the *remaining* batch indices of the old
   one (the sampler is not iterated again, so the batch order is the one the epoch had);
3. the old object's class is switched to ``_Redirected``, whose ``__next__`` yields the drained
   batches, then the new iterator's: the script's ``for`` loop holds the old object.

Building an iterator draws a worker base seed from ``loader.generator`` (or the global RNG):
the new one draws it from a private generator instead, so no generator the script uses moves.
``revert()`` restores the settings and restarts the running iterator again the same way.
Worker processes get other random streams than the main process: ``live-opt-in`` when the
worker count changes (per recommendation; see ``recommend/remedies/dataloader.py``). Turning
``persistent_workers`` on also changes later epochs' order: a persistent iterator draws no new
worker base seed from ``loader.generator`` at each epoch, so the shuffle draws shift (the input
rule never proposes it).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader
from torch.utils.data import dataloader as _dl

from advisor.apply.loader_settings import loader_settings
from advisor.apply.target import Target

logger = logging.getLogger("advisor.apply")

PHASE = "layout"
SETTINGS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")


class _Remaining:
    """An index sampler stand-in whose one iteration continues an old iterator's batches."""

    def __init__(self, indices: Iterator[Any]) -> None:
        self._indices = indices

    def __iter__(self) -> Iterator[Any]:
        return self._indices


def _resumed_class(base: type) -> type:
    class Resumed(base):  # type: ignore[misc, valid-type]
        """``base`` whose first epoch runs on the given remaining indices."""

        def __init__(self, loader: DataLoader, remaining: Iterator[Any]) -> None:
            self._advisor_remaining = remaining
            super().__init__(loader)  # the base makes a sampler iterator: lazy, nothing drawn yet
            if self._advisor_remaining is not None:  # no _reset ran (a single-process iterator)
                self._index_sampler = _Remaining(self._advisor_remaining)
                self._sampler_iter = self._advisor_remaining
                self._advisor_remaining = None

        def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
            if first_iter and self._advisor_remaining is not None:
                self._index_sampler = _Remaining(self._advisor_remaining)
                self._advisor_remaining = None
            else:  # a later epoch of a persistent iterator: the loader's own sampler again
                self._index_sampler = loader._index_sampler
            super()._reset(loader, first_iter)

    Resumed.__name__ = f"Resumed{base.__name__}"
    return Resumed


_RESUMED = {cls: _resumed_class(cls) for cls in (_dl._SingleProcessDataLoaderIter,
                                                 _dl._MultiProcessingDataLoaderIter)}


class _Redirected(_dl._BaseDataLoaderIter):
    """What the script's running iterator becomes: drained batches first, then the new iterator."""

    def __next__(self) -> Any:
        if self._advisor_buffer:
            return self._advisor_buffer.pop(0)
        return next(self._advisor_next)

    def __len__(self) -> int:
        return len(self._advisor_next)


def _drain(it: Any) -> tuple[list[Any], Iterator[Any]]:
    """(batches already asked of ``it``'s workers, in order; its remaining indices); shuts it down."""
    if isinstance(it, _Redirected):
        buffered, rest = _drain(it._advisor_next)
        return list(it._advisor_buffer) + buffered, rest
    rest = it._sampler_iter
    buffered: list[Any] = []
    if isinstance(it, _dl._MultiProcessingDataLoaderIter):
        it._sampler_iter = iter(())  # no new indices go to the workers while draining
        for _ in range(it._send_idx - it._rcvd_idx):
            buffered.append(it._next_data())
        it._shutdown_workers()
    return buffered, rest


def _new_iterator(loader: DataLoader, remaining: Iterator[Any]) -> Any:
    cls = _dl._MultiProcessingDataLoaderIter if loader.num_workers > 0 else _dl._SingleProcessDataLoaderIter
    own = loader.generator
    private = torch.Generator()
    private.manual_seed(int.from_bytes(os.urandom(7), "little"))  # the worker base seed's source
    loader.generator = private
    try:
        return _RESUMED[cls](loader, remaining)
    finally:
        loader.generator = own


def _set(loader: DataLoader, values: dict[str, Any]) -> None:
    for key, value in values.items():
        object.__setattr__(loader, key, value)  # past DataLoader.__setattr__'s persistent_workers guard


def _notify(target: Any, loader: DataLoader, index: int) -> None:
    notify = getattr(target, "notify", None)
    if callable(notify):
        notify("dataloader", loader_settings(loader, index))


@dataclass(eq=False)
class DataLoaderHandle:
    loader: DataLoader
    previous: dict[str, Any]
    running: Any  # the iterator object the script's loop holds (None: none was running)
    target: Any = None
    index: int = 0
    reverted: bool = False
    step_period: int = 1  # the workers deliver batches in turn: step times repeat every num_workers

    def revert(self) -> None:
        if self.reverted:
            return
        _switch(self.loader, self.previous, self.running)
        _notify(self.target, self.loader, self.index)
        self.reverted = True
        logger.info("Restored the DataLoader's %s", ", ".join(f"{k}={v}" for k, v in self.previous.items()))


def _switch(loader: DataLoader, values: dict[str, Any], running: Any) -> None:
    persistent = getattr(loader, "_iterator", None)
    live = running is not None and not _exhausted(running)
    if live:
        buffered, rest = _drain(running)
    elif persistent is not None:
        persistent._shutdown_workers()  # PYTORCH-NOTES: persistent workers go before a change
    loader._iterator = None
    _set(loader, values)
    if live:
        new = _new_iterator(loader, rest)
        if loader.persistent_workers and loader.num_workers > 0:
            loader._iterator = new  # the next epoch's iter() resets it, as DataLoader would
        running._advisor_buffer = buffered
        running._advisor_next = new
        running.__class__ = _Redirected


def _exhausted(it: Any) -> bool:
    inner = it._advisor_next if isinstance(it, _Redirected) else it
    return inner._sampler_iter is None or getattr(inner, "_shutdown", False)


def apply_dataloader(target: Target, *, loader: int = 0, num_workers: int | None = None,
                     pin_memory: bool | None = None, prefetch_factor: int | None = None,
                     persistent_workers: bool | None = None) -> DataLoaderHandle:
    """Set the given settings on captured DataLoader ``loader`` and restart its running iterator."""
    loaders = list(getattr(target, "dataloaders", []) or [])
    if not 0 <= loader < len(loaders):
        raise ValueError(f"loader must be an index in 0..{len(loaders) - 1} (DataLoaders captured: "
                         f"{len(loaders)})")
    obj = loaders[loader]
    workers = obj.num_workers if num_workers is None else num_workers
    wanted = {"num_workers": num_workers, "pin_memory": pin_memory,
              "prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers}
    if workers > 0 and obj.prefetch_factor is None and prefetch_factor is None:
        wanted["prefetch_factor"] = 2  # DataLoader's own default with workers
    if workers == 0:
        if wanted["prefetch_factor"] is not None:
            raise ValueError("prefetch_factor needs num_workers > 0")
        wanted["prefetch_factor"], wanted["persistent_workers"] = None, False
    if wanted.get("pin_memory") and not torch.accelerator.is_available():
        raise ValueError("pin_memory needs an accelerator (CUDA); this process has none")
    values = {k: v for k, v in wanted.items() if v is not None or k == "prefetch_factor" and workers == 0}
    previous = {k: getattr(obj, k) for k in values}
    if all(previous[k] == v for k, v in values.items()):
        raise ValueError(f"the DataLoader already has {values}")
    iterators = list(getattr(target, "dataloader_iterators", []) or [])
    running = iterators[loader] if loader < len(iterators) else None
    _switch(obj, values, running)
    logger.info("DataLoader set to %s%s", ", ".join(f"{k}={v}" for k, v in values.items()),
                "; its running iterator restarted on the remaining batches" if running is not None else "")
    _notify(target, obj, loader)
    return DataLoaderHandle(loader=obj, previous=previous, running=running, target=target, index=loader,
                            step_period=max(1, int(obj.num_workers)))
