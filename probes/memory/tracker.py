"""Exact storage accounting by category: a dispatch mode plus saved-tensor hooks.

Each op's output storages are registered when an op first produces them (outputs whose storage
is already known, i.e. views and in-place results, are not counted again), and
``weakref.finalize`` on the untyped storage sees the free. ``torch.autograd.graph
.saved_tensors_hooks`` marks the storages autograd saves for backward; the packed holder's
release tells when autograd lets go of them. Costs about a few times a step (every op goes
through Python), so it runs on deep-sampled steps only, or on every step under an enforced
budget on CPU.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from advisor.probes.memory.categories import choose_category, device_type_of, role_tensors, storage_of, tensors_in
from advisor.probes import saved_hooks
from advisor.probes.memory.resized import ResizeWatch
from advisor.records import host_memory
from advisor.records.samples import MEMORY_CATEGORIES

DEVICE_EXEMPT = ("offloaded_host",)  # categories a device budget never counts (host copies on CPU)


def _op_name(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return str(packet) if packet is not None else str(func)


class _Entry:
    __slots__ = ("nbytes", "origin", "step", "module", "op", "category", "finalizer", "seq")

    def __init__(self, nbytes: int, origin: str, step: int, module: str | None, op: str, seq: int) -> None:
        self.nbytes = nbytes
        self.origin = origin
        self.step = step
        self.module = module
        self.op = op
        self.category = "other"
        # A weak reference whose callback is the storage's death (``StorageTracker._dead``); dropping
        # it detaches. Not ``weakref.finalize``: 5.3 us against 0.35 us each, for every storage a
        # deep step creates (50,000 at 5001 modules).
        self.finalizer: weakref.ref | None = None
        self.seq = seq  # when it was registered (``StorageTracker.seq``); -1: alive before tracking


class _Packed:
    """What autograd keeps for a saved tensor while our hooks are on; its death means release."""

    __slots__ = ("tensor", "key", "tracker", "generation")

    def __init__(self, tensor: torch.Tensor, key: int, tracker: "StorageTracker") -> None:
        # detach(): keeping the saved output itself (with its grad_fn) makes a reference cycle
        # through the C++ graph that is never freed; autograd rebuilds the link on unpack. Out of
        # every dispatch mode: the compute probe's counter would count it as the script's op.
        with _disable_current_modes():
            self.tensor = tensor.detach()
        self.key = key
        self.tracker = tracker
        self.generation = tracker.generation

    def __del__(self) -> None:
        self.tracker._unsave(self.key, self.generation)


@dataclass(frozen=True, kw_only=True)
class BudgetExceeded:
    """What the tracker knew when an op's outputs would have exceeded the budget."""

    op: str
    module: str | None
    requested_bytes: int
    budget_bytes: int
    tracked_bytes: int
    categories: dict[str, int]
    top_modules: list[dict[str, Any]]
    step: int
    phase: str


def _data_ptr(tensor: torch.Tensor) -> int | None:
    """Where the tensor's data is (None for a tensor without data: fake, meta, wrapper subclasses)."""
    try:
        return tensor.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class StorageTracker(TorchDispatchMode):
    """Live bytes by category of the storages on ``device_type``, updated op by op.

    ``current_module`` names the innermost module running (for attribution); ``on_op`` is called
    after each op that allocated (the timeline); ``on_saved(key, nbytes, is_role)`` when autograd
    saves a storage; ``on_backward_op(node, seconds)`` for each op run by an autograd node;
    ``on_budget_exceeded`` just before ``torch.OutOfMemoryError`` is raised.
    """

    def __init__(
        self,
        *,
        device_type: str = "cpu",
        budget_bytes: int | None = None,
        current_module: Callable[[], str | None] = lambda: None,
        on_op: Callable[[str, str | None], None] | None = None,
        on_saved: Callable[[int, int, bool], None] | None = None,
        on_backward_op: Callable[[Any, float], None] | None = None,
        on_budget_exceeded: Callable[[BudgetExceeded], None] | None = None,
        block_bytes: Callable[[int], int] | None = None,
    ) -> None:
        super().__init__()
        self.device_type = device_type
        # What an allocation of n bytes takes (``advisor fit``'s fake CUDA: the caching allocator's
        # blocks, ``probes/memory/cuda.allocator_block_bytes``); None: the storage's own bytes.
        self.block_bytes = block_bytes
        self.budget_bytes = budget_bytes
        self.current_module = current_module
        self.on_op = on_op
        self.on_saved = on_saved
        self.on_backward_op = on_backward_op
        self.on_budget_exceeded = on_budget_exceeded
        self.entries: dict[int, _Entry] = {}
        self.roles: dict[int, str] = {}
        self.saved: dict[int, int] = {}  # storage key -> number of live saved references
        self.totals: dict[str, int] = dict.fromkeys(MEMORY_CATEGORIES, 0)
        self.total = 0
        self.peak_total = 0
        self.peak_categories: dict[str, int] = dict(self.totals)
        self.step = 0
        self.phase = "data"
        self.generation = 0
        self.active = False
        self.paused = False  # out of the dispatch mode and hooks, still counting frees (pause())
        self.failed_op: tuple[str, str | None] | None = None
        self.seq = 0  # storages registered so far: a clock that orders creations and module calls
        self.op_bytes = 0  # bytes of the new storages of the last op that allocated (on_op reads it)
        self._hooks: Any = None
        self._resizes = ResizeWatch(self._resized_away, self._resized_back)
        self._role_cache: dict[int, tuple[int, int | None, int]] = {}  # id -> (_cdata, data_ptr, key): refresh_roles
        self._ref_keys: dict[int, int] = {}  # id of a storage's weak reference -> its key (``_dead``)
        self._on_dead = self._dead  # one bound method for every weak reference
        self.ops = 0  # ops and saves seen (refresh_roles walks again only after one)
        self._walked: tuple | None = None  # what the last role walk saw (refresh_roles)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Enter the dispatch mode and the saved-tensor hooks on this thread."""
        self.generation += 1
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        saved_hooks.push(self._hooks)  # steps aside for torch.func's transforms
        self.__enter__()
        self.active = True
        host_memory.listeners.append(self._reclassify)
        self._resizes.ensure()

    def pause(self) -> None:
        """Leave the mode and hooks between two tracked steps, keeping what is alive: frees are
        still seen (finalizers), so ``resume()`` goes on without a new scan of live tensors.
        Storages created while paused are counted once an op produces or autograd saves them."""
        if self.active and not self.paused:
            self.paused = True
            self.__exit__(None, None, None)
            saved_hooks.pop(self._hooks)

    def resume(self) -> None:
        if self.active and self.paused:
            self.paused = False
            self._walked = None  # the light steps between changed what the mode did not see
            saved_hooks.push(self._hooks)
            self.__enter__()

    def stop(self) -> None:
        """Leave the mode and hooks (in reverse order) and forget every storage."""
        if not self.active:
            return
        self.active = False
        if self._reclassify in host_memory.listeners:
            host_memory.listeners.remove(self._reclassify)
        self._resizes.stop()
        if not self.paused:
            self.__exit__(None, None, None)
            saved_hooks.pop(self._hooks)
        self.paused = False
        self._hooks = None
        for entry in self.entries.values():
            entry.finalizer = None
        self.entries.clear()
        self._ref_keys.clear()
        self.roles.clear()
        self._role_cache = {}
        self.saved.clear()
        self.totals = dict.fromkeys(MEMORY_CATEGORIES, 0)
        self.total = 0
        self.generation += 1

    def reset_peak(self) -> None:
        self.peak_total = self.device_total()
        self.peak_categories = dict(self.totals)

    # -- what is alive ---------------------------------------------------------------------
    def add_existing(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count storages that were alive before tracking began (category other unless a role)."""
        for tensor in tensors:
            self._ensure(tensor, origin="other", step=-1, op="existing")

    def refresh_roles(
        self, models: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer]
    ) -> None:
        """Re-read parameters, ``.grad`` and ``optimizer.state``; re-classify what changed.

        Incremental: a role tensor that is the same object as at the last refresh (its id and its
        ``TensorImpl``'s address, ``_cdata``), over the same memory (``data_ptr``), whose storage is
        still tracked, keeps its key without a storage lookup (0.25 s per call at 5001 modules, 19
        calls in three deep memory steps); only new or moved tensors are looked up. A tensor that
        took a dead one's id and address over the same memory and a tracked storage is over that
        storage, whose key the cache names. The cache holds integers only: the garbage collector
        stops walking its tuples (a weak reference per tensor was 25,000 more objects to walk)."""
        models, optimizers = list(models), list(optimizers)
        # Nothing ran through the mode since the last walk (an optimizer's post-hook and the step's
        # end; tracking's start and the first phase): the roles are those it found.
        token = (self.ops, self.generation, [id(m) for m in models], [id(o) for o in optimizers])
        if token == self._walked:
            return
        self._walked = token
        cache = self._role_cache
        fresh: dict[int, tuple[int, int | None, int]] = {}
        new: dict[int, str] = {}
        for role, tensor in role_tensors(models, optimizers):
            ptr = _data_ptr(tensor)
            hit = cache.get(id(tensor))
            if hit is not None and ptr is not None and hit[1] == ptr and hit[0] == tensor._cdata and hit[2] in self.entries:
                key: int | None = hit[2]
                fresh[id(tensor)] = hit
            else:
                key = self._ensure(tensor, origin="other", step=-1, op="existing")
                if key is None:
                    continue
                fresh[id(tensor)] = (tensor._cdata, ptr, key)
            if key not in new:
                new[key] = role
        self._role_cache = fresh
        changed = {k for k in new.keys() | self.roles.keys() if new.get(k) != self.roles.get(k)}
        self.roles = new
        for key in changed:
            self._reclassify(key)

    def set_role(self, tensor: torch.Tensor, role: str) -> None:
        key = self._ensure(tensor, origin="other", step=-1, op="existing")
        if key is not None and self.roles.get(key) != role:
            self.roles[key] = role
            self._reclassify(key)

    def set_step(self, step: int) -> None:
        if self.active:
            self._resizes.ensure()  # FSDP2 may have been imported since (a live ZeRO switch)
        if step != self.step:
            self.step = step
            for key in list(self.entries):
                self._reclassify(key)

    def device_total(self) -> int:
        """Tracked bytes a device budget counts: all but the offload remedies' host copies."""
        totals = self.totals  # called two or three times per op: no generator
        return self.total - (totals[DEVICE_EXEMPT[0]] if len(DEVICE_EXEMPT) == 1
                             else sum(totals[c] for c in DEVICE_EXEMPT))

    def top_modules(self, limit: int = 5) -> list[dict[str, Any]]:
        """Live bytes by the module whose op created them, largest first."""
        by_module: dict[str, int] = {}
        for entry in list(self.entries.values()):
            if entry.module is not None:
                by_module[entry.module] = by_module.get(entry.module, 0) + entry.nbytes
        ranked = sorted(by_module.items(), key=lambda kv: -kv[1])[:limit]
        return [{"name": name, "bytes": nbytes} for name, nbytes in ranked]

    # -- bookkeeping -----------------------------------------------------------------------
    def _ensure(self, tensor: torch.Tensor, *, origin: str, step: int, op: str) -> int | None:
        storage = storage_of(tensor)
        if storage is None or device_type_of(tensor) != self.device_type:
            return None
        key = storage._cdata
        if key not in self.entries:
            nbytes = self._size(storage)
            if nbytes == 0:
                return None
            self._add(key, storage, nbytes, origin, step, op)
        return key

    def _size(self, storage: torch.UntypedStorage) -> int:
        nbytes = storage.nbytes()
        return self.block_bytes(nbytes) if nbytes and self.block_bytes is not None else nbytes

    def _add(
        self, key: int, storage: torch.UntypedStorage, nbytes: int, origin: str, step: int, op: str
    ) -> None:
        # A storage first seen when autograd saves it existed before tracking began.
        seq = -1 if op == "existing" else self.seq
        self.seq += 1
        entry = _Entry(nbytes, origin, step, self.current_module(), op, seq)
        entry.category = self._category(key, entry)
        ref = entry.finalizer = weakref.ref(storage, self._on_dead)
        self._ref_keys[id(ref)] = key
        self.entries[key] = entry
        self.totals[entry.category] += nbytes
        self.total += nbytes

    def _category(self, key: int, entry: _Entry) -> str:
        return choose_category(
            self.roles.get(key),
            saved=self.saved.get(key, 0) > 0,
            created_step=entry.step,
            step=self.step,
            origin=entry.origin,
            offloaded=host_memory.is_offloaded(key),
        )

    def _reclassify(self, key: int) -> None:
        entry = self.entries.get(key)
        if entry is None:
            return
        category = self._category(key, entry)
        if category != entry.category:
            self.totals[entry.category] -= entry.nbytes
            self.totals[category] += entry.nbytes
            entry.category = category

    def _dead(self, ref: weakref.ref) -> None:
        # Every storage's weak reference shares this one callback (``_on_dead``) and finds its key
        # by the reference's id: a partial per storage made two more objects for the garbage
        # collector to walk per storage (50,000 at 5001 modules). A reference dropped by ``stop``
        # or a resize never calls back, and its id leaves the map with it.
        key = self._ref_keys.pop(id(ref), None)
        if key is not None:
            self._freed(key, self.generation)

    def _freed(self, key: int, generation: int) -> None:
        if generation != self.generation:
            return
        entry = self.entries.pop(key, None)
        self.roles.pop(key, None)
        self.saved.pop(key, None)
        if entry is not None:
            if entry.finalizer is not None:
                self._ref_keys.pop(id(entry.finalizer), None)
            self.totals[entry.category] -= entry.nbytes
            self.total -= entry.nbytes

    def _resized_away(self, tensor: torch.Tensor) -> None:
        """FSDP2 is about to free ``tensor``'s storage by resizing it to 0 (``resized.py``)."""
        self.ops += 1
        storage = storage_of(tensor)
        entry = self.entries.get(storage._cdata) if storage is not None else None
        if entry is not None:
            self._freed(storage._cdata, self.generation)  # type: ignore[union-attr]
            entry.finalizer = None

    def _resized_back(self, tensor: torch.Tensor) -> None:
        """FSDP2 re-allocated ``tensor``'s storage: count it again, from now."""
        self.ops += 1
        if self._ensure(tensor, origin="temporary", step=self.step, op="fsdp.alloc_storage") is not None:
            self._note_peak()

    def _note_peak(self) -> None:
        # The device's peak: an offload remedy's host copies are not on the device, so they
        # neither make a peak nor hide the drop the remedy made (the step's peak_memory_bytes).
        total = self.device_total()
        if total > self.peak_total:
            self.peak_total = total
            self.peak_categories = dict(self.totals)

    # -- saved tensors ---------------------------------------------------------------------
    def _pack(self, tensor: torch.Tensor) -> Any:
        self.ops += 1
        key = self._ensure(tensor, origin="other", step=-1, op="existing")
        if key is None:
            return tensor
        self.saved[key] = self.saved.get(key, 0) + 1
        self._reclassify(key)
        if self.on_saved is not None:
            self.on_saved(key, self.entries[key].nbytes, key in self.roles)
        return _Packed(tensor, key, self)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Packed) else packed

    def _unsave(self, key: int, generation: int) -> None:
        if generation != self.generation or key not in self.saved:
            return
        self.saved[key] -= 1
        if self.saved[key] <= 0:
            del self.saved[key]
            self._reclassify(key)

    # -- every op --------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        self.ops += 1
        node = torch._C._current_autograd_node() if self.on_backward_op is not None else None
        start = time.perf_counter()
        try:
            out = func(*args, **(kwargs or {}))
        except torch.OutOfMemoryError:
            # A real allocator OOM inside an op: the flight recorder names it from here.
            self.failed_op = (_op_name(func), self.current_module())
            raise
        if node is not None:
            self.on_backward_op(node, time.perf_counter() - start)  # type: ignore[misc]
        self._register_outputs(func, out)
        return out

    def _register_outputs(self, func: Any, out: Any) -> None:
        fresh: list[tuple[int, torch.UntypedStorage, int]] = []
        for tensor in tensors_in(out):
            storage = storage_of(tensor)
            if storage is None or device_type_of(tensor) != self.device_type:
                continue
            key = storage._cdata
            # Views and in-place results share a storage we already count.
            if key in self.entries or any(key == k for k, _, _ in fresh):
                continue
            nbytes = self._size(storage)
            if nbytes:
                fresh.append((key, storage, nbytes))
        if not fresh:
            return
        op = _op_name(func)
        requested = sum(n for k, _, n in fresh if not host_memory.is_offloaded(k))  # host copies: not the device's
        if self.budget_bytes is not None and self.device_total() + requested > self.budget_bytes:
            self._exceeded(op, requested)
        origin = "input" if self.phase == "data" else "temporary"
        for key, storage, nbytes in fresh:
            self._add(key, storage, nbytes, origin, self.step, op)
        self.op_bytes = requested
        self._note_peak()
        if self.on_op is not None:
            self.on_op(op, self.current_module())

    def _exceeded(self, op: str, requested: int) -> None:
        budget = int(self.budget_bytes or 0)
        info = BudgetExceeded(
            op=op,
            module=self.current_module(),
            requested_bytes=requested,
            budget_bytes=budget,
            tracked_bytes=self.total,
            categories=dict(self.totals),
            top_modules=self.top_modules(),
            step=self.step,
            phase=self.phase,
        )
        if self.on_budget_exceeded is not None:
            self.on_budget_exceeded(info)
        error = torch.OutOfMemoryError(
            f"advisor memory budget exceeded: {op} asked for {requested} bytes with {self.total} "
            f"tracked, budget {budget} bytes (enforced by --memory-budget)"
        )
        error.advisor_oom_recorded = True  # type: ignore[attr-defined]
        raise error
