"""``MemoryProbe``: the agent-facing side of the memory probe.

Light steps (every step): on CUDA one ``MemorySample`` per phase boundary from the caching
allocator (``torch.cuda.memory_allocated``; parameter, gradient and optimizer-state bytes read
off the model, the rest shown as other); on CPU one sample per step, at the start of the
optimizer phase, with parameter, gradient and optimizer-state bytes only. Deep steps: the storage
tracker gives exact categories after every op that allocates, plus one ``ModuleStat`` per module.

With ``enforce_budget`` on CPU the tracker runs on every step from ``attach`` on, so that
exceeding the budget raises a real ``torch.OutOfMemoryError``: every step then costs what a deep
step costs (every op goes through Python; several times a plain step, see
``bench/memory_accuracy.py``), though op-level samples are still only emitted on deep steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
from typing import Any, Iterable, Iterator

import torch

from advisor.probes.memory.budget import apply_cuda_budget
from advisor.probes.memory.categories import live_tensors, local_part, role_tensors, storage_key
from advisor.probes.device.nvml import Nvml
from advisor.probes.memory.cuda import (
    allocator_block_bytes,
    allocator_counters,
    allocator_view,
    device_uuid,
    dump_snapshot,
    start_memory_history,
    stop_memory_history,
)
from advisor.probes.memory.light_series import LightSeries
from advisor.probes.memory.modules import ModuleAttributor
from advisor.probes.memory.oom import (
    is_oom,
    module_from_traceback,
    requested_bytes_from_message,
    session_folder,
    user_frames,
)
from advisor.probes.memory.tracker import BudgetExceeded, StorageTracker
from advisor.probes.probe import AgentContext, Probe
from advisor.records import host_memory
from advisor.records.samples import MEMORY_CATEGORIES, Event, MemorySample
from advisor.records.table import TableBuilder, tabled

LIGHT_REFRESH_STEPS = 100  # re-read parameter and optimizer-state sizes this often on light steps


def _quiet(probe: MemoryProbe, ctx: AgentContext) -> Iterator[None]:
    """``MemoryProbe.quiet``: the agent's own work between steps (``advisor/agent/checkpoint_trial.py``)
    is not the job's: the tracker steps aside (an enforced budget would count the trial's copy), and
    on CUDA the peak is reset after it (the next step's peak is its own)."""
    tracker = probe.tracker
    paused = tracker is not None and tracker.active and not tracker.paused
    if paused:
        tracker.pause()  # type: ignore[union-attr]
    try:
        yield
    finally:
        if paused:
            tracker.resume()  # type: ignore[union-attr]
        if probe.cuda:
            torch.cuda.reset_peak_memory_stats(_cuda_index(ctx))


class MemoryProbe(Probe):
    """Memory by category and by module, the budget, and the OOM flight recorder."""

    name = "memory"
    dispatch_mode_deep = True  # the storage tracker

    def __init__(
        self, *, scan_gc: bool = True, nvml: Nvml | None = None, history_max_entries: int = 100_000
    ) -> None:
        self.scan_gc = scan_gc  # count every live tensor at start_deep, not only model state
        self.nvml = nvml or Nvml()
        self.history_max_entries = history_max_entries
        self.budget_bytes: int | None = None
        self.enforce = False
        self.cuda = False  # decided by _follow_device once the job's device is known
        self._device_known = False
        self._cuda_available = False
        self.continuous = False  # tracker on every step (enforced budget on CPU)
        # CUDA with an enforced budget: the tracker runs from the first step until the first deep
        # step ends, so an OOM in the warm-up step is recorded by op, category and module.
        self.until_deep = False
        self.deep = False
        self.tracker: StorageTracker | None = None
        self.attributor: ModuleAttributor | None = None
        self._ctx: AgentContext | None = None
        self._handles: list[Any] = []
        self._light: dict[str, int] = {}
        self._light_step = -(10**9)
        self._retries = 0
        self._params: list[torch.Tensor] = []
        # The gradient bytes of light samples (``_gradient_bytes``): one parameter's gradient
        # watched, the total of the last walk.
        self._grad_sentinel: torch.Tensor | None = None
        self._sentinel_bytes = 0
        self._grad_total: int | None = None
        self._deep_peak: tuple[int, int] | None = None  # (step, tracked peak) of the last deep step
        self._series = LightSeries()  # light samples downsampled as the run grows
        self._rows = TableBuilder(MemorySample)  # a deep step's samples, as columns

    # -- Probe hooks -----------------------------------------------------------------------
    def attach(self, ctx: AgentContext) -> None:
        self._ctx = ctx
        self.budget_bytes = ctx.settings.memory_budget_bytes
        self.enforce = ctx.settings.enforce_budget and self.budget_bytes is not None
        self.cuda = False
        self._device_known = False
        self._cuda_available = torch.cuda.is_available()
        if self._cuda_available:
            # The job's device is not known before its model is (a CPU job on a GPU host is
            # possible); both of these act on CUDA allocations only, so a CPU job pays nothing.
            start_memory_history(self.history_max_entries)
            if self.enforce:
                apply_cuda_budget(self.budget_bytes)  # type: ignore[arg-type]
        self._follow_device(ctx)

    def _follow_device(self, ctx: AgentContext) -> None:
        """Decide once which view measures this job: the CUDA allocator's when its parameters are
        on a CUDA device (``ctx.device``, set from the first model found), else the tracker.
        Deciding by ``torch.cuda.is_available()`` alone read an empty allocator for a CPU job on
        a GPU host and left its budget unenforced."""
        if self._device_known or (self._cuda_available and not ctx.models()):
            return
        self._device_known = True
        self.cuda = self._cuda_available and ctx.device.type == "cuda"
        if not self.cuda and self.enforce and self.tracker is None:
            self.continuous = True
            self._start_tracking(ctx, ctx.step, "cpu")
        elif self.cuda and self.enforce and self.tracker is None:
            # The allocator enforces the budget (``apply_cuda_budget``), but a job that runs out in
            # its first step would leave no figure to plan from: the OOM record read parameters
            # only, and the plan named an optimizer-state offload for a forward that had none
            # (an H200, 2026-11-26). Track until the first deep step has measured everything.
            self.continuous = self.until_deep = True
            self._start_tracking(ctx, ctx.step, "cuda")

    def on_phase(self, ctx: AgentContext, phase: str, now: float) -> None:
        self._follow_device(ctx)
        if self.tracker is not None and self.tracker.paused and not _deep_next(ctx):
            self._stop_tracking()  # kept for a deep step that will not come (deep sampling ended)
        tracker = self.tracker
        if tracker is not None:
            tracker.phase = phase
            tracker.set_step(ctx.step)
            # Every phase: FSDP2 swaps a layer's gathered parameters in during its forward (a walk at
            # the backward's start names them parameters); the walk is skipped when nothing ran
            # since the last (``refresh_roles``).
            tracker.refresh_roles(ctx.models(), ctx.optimizers())
            self._emit_tracked(ctx, f"{phase}_start", None)
        elif self.cuda or phase == "optimizer":
            self._emit_light(ctx, phase)

    def start_deep(self, ctx: AgentContext, step: int) -> None:
        self._follow_device(ctx)
        self.deep = True
        device_type = ctx.device.type
        if self.tracker is not None and self.tracker.paused:
            self.tracker.resume()  # kept from the deep step before: no new scan of live tensors
        elif self.tracker is None:
            self._start_tracking(ctx, step, device_type)
        tracker, attributor = self.tracker, self.attributor
        assert tracker is not None and attributor is not None  # set by _start_tracking
        tracker.phase = "data"
        tracker.set_step(step)
        tracker.reset_peak()
        attributor.reset()
        grad_ready = self._grad_ready  # one bound method for every parameter's hook
        for p in _parameters(ctx):
            self._handles.append(p.register_post_accumulate_grad_hook(grad_ready))
        for opt in ctx.optimizers():
            self._handles.append(opt.register_step_post_hook(self._optimizer_stepped))

    def stop_deep(self, ctx: AgentContext, step: int) -> None:
        tracker, attributor = self.tracker, self.attributor
        self.deep = False
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if tracker is None or attributor is None:
            return
        tracker.refresh_roles(ctx.models(), ctx.optimizers())
        _emit_all(ctx, self._rows.take())  # the step's samples before its end's (``deep`` is off: sent as it is)
        self._emit_tracked(ctx, "step_end", None, step=step, force=True)
        _emit_all(ctx, tabled(attributor.stats(step=step, rank=ctx.rank)))  # 5001 modules: as columns
        ctx.emit(
            Event(
                rank=ctx.rank,
                step=step,
                name="module_activations",
                data={"inclusive_bytes": attributor.inclusive_activations()},
            )
        )
        if self.cuda:
            ctx.emit(Event(rank=ctx.rank, step=step, name="cuda_memory", data=self._cuda_view(ctx)))
        attributor.reset()
        self._deep_peak = (step, tracker.peak_total)
        if self.until_deep:
            self.continuous = self.until_deep = False
        if not self.continuous:
            if _deep_next(ctx):
                # Deep again next (or after the compute probe's own step): keep what is alive;
                # scanning every live object again cost about 1.5 light GPT steps on CPU
                tracker.pause()
            else:
                self._stop_tracking()

    quiet = contextlib.contextmanager(_quiet)

    def on_step_end(self, ctx: AgentContext, step: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self._deep_peak is not None and self._deep_peak[0] == step:
            out["peak_memory_bytes"] = self._deep_peak[1]
        elif self.tracker is not None and not self.tracker.paused:
            out["peak_memory_bytes"] = self.tracker.peak_total
            if self.continuous and not self.deep:
                self.tracker.reset_peak()
        if self.cuda:
            index = _cuda_index(ctx)
            counters = allocator_counters(index)
            out["peak_memory_bytes"] = counters["peak_allocated_bytes"]
            torch.cuda.reset_peak_memory_stats(index)
            retries = counters["alloc_retries"]
            if retries != self._retries:  # the allocator had to flush its cache: worth a record
                self._retries = retries
                ctx.emit(Event(rank=ctx.rank, step=step, name="cuda_memory", data=self._cuda_view(ctx)))
        return out

    def on_exception(self, ctx: AgentContext, exc: BaseException) -> None:
        if not is_oom(exc):
            return
        self._follow_device(ctx)
        self._emit_partial_step(ctx)
        for sample in self._series.flush():  # the light steps' largest, before the OOM's record
            ctx.emit(sample)
        if getattr(exc, "advisor_oom_recorded", False):
            return
        tracker = self.tracker
        op, module = (tracker.failed_op or (None, None)) if tracker is not None else (None, None)
        message = str(exc)
        data: dict[str, Any] = {
            "kind": "cuda" if self.cuda else "error",
            "message": message[:2000],
            "op": op,
            "module": module or module_from_traceback(exc.__traceback__, ctx.module_name),
            "requested_bytes": requested_bytes_from_message(message),
            "budget_bytes": self.budget_bytes,
            "categories": dict(tracker.totals) if tracker is not None else self._light_categories(ctx),
            "inferred_bytes": {},
            "top_modules": tracker.top_modules() if tracker is not None else [],
            "frames": user_frames(traceback.extract_tb(exc.__traceback__)),
            "step": ctx.step,
            "phase": ctx.phase,
            "snapshot_path": None,
        }
        if self.cuda:
            data.update(self._cuda_view(ctx))
            data["snapshot_path"] = dump_snapshot(session_folder())
            if tracker is None:
                data["inferred_bytes"] = infer_untracked(data["categories"], data.get("allocated_bytes"), ctx.phase)
        ctx.emit(Event(rank=ctx.rank, step=ctx.step, name="oom", data=data))
        try:
            exc.advisor_oom_recorded = True  # type: ignore[attr-defined]
        except AttributeError:
            pass

    def detach(self, ctx: AgentContext) -> None:
        _emit_all(ctx, self._rows.take())
        for sample in self._series.flush():
            ctx.emit(sample)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stop_tracking()
        if self.cuda:
            stop_memory_history()

    def _emit_partial_step(self, ctx: AgentContext) -> None:
        """Emit what the failing step measured so far (per-module activations of the forward
        that ran), so that nothing is lost and a plan can be solved from the failed session."""
        tracker, attributor = self.tracker, self.attributor
        if tracker is None or attributor is None:
            return
        step = ctx.step
        self._emit_tracked(ctx, "oom", None, step=step, force=True)
        _emit_all(ctx, self._rows.take())
        _emit_all(ctx, tabled(attributor.stats(step=step, rank=ctx.rank)))  # 5001 modules: as columns
        ctx.emit(Event(rank=ctx.rank, step=step, name="module_activations",
                       data={"inclusive_bytes": attributor.inclusive_activations(), "partial": True}))

    # -- tracking --------------------------------------------------------------------------
    def _start_tracking(self, ctx: AgentContext, step: int, device_type: str) -> None:
        attributor = ModuleAttributor(
            name_of=ctx.module_name, in_backward=ctx.in_backward, device_type=device_type
        )
        # ``advisor fit`` on a GPU target: storages are fake, and sized as the caching allocator would.
        fake_cuda = device_type == "cuda" and ctx.settings.fit is not None
        tracker = StorageTracker(
            block_bytes=allocator_block_bytes if fake_cuda else None,
            device_type=device_type,
            budget_bytes=self.budget_bytes if self.continuous and not self.cuda else None,
            current_module=attributor.current,
            on_op=self._on_op,
            on_saved=attributor.on_saved,
            on_backward_op=attributor.on_backward_op,
            on_budget_exceeded=self._on_budget_exceeded,
        )
        attributor.clock, attributor.created_at = (lambda: tracker.seq), (lambda key: tracker.entries[key].seq)
        tracker.step = step
        tracker.phase = ctx.phase
        tracker.start()
        attributor.start(ctx)
        self.tracker, self.attributor = tracker, attributor
        tracker.refresh_roles(ctx.models(), ctx.optimizers())
        if self.scan_gc:
            # Tensors alive before tracking began (the user's own buffers, the last loss): other.
            tracker.add_existing(live_tensors())
        tracker.reset_peak()

    def _stop_tracking(self) -> None:
        if self.attributor is not None:
            self.attributor.stop()
        if self.tracker is not None:
            self.tracker.stop()
        self.tracker = self.attributor = None

    def _grad_ready(self, param: torch.Tensor) -> None:
        if self.tracker is not None and param.grad is not None:
            self.tracker.set_role(param.grad, "gradient")

    def _optimizer_stepped(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.tracker is not None and self._ctx is not None:
            self.tracker.refresh_roles(self._ctx.models(), self._ctx.optimizers())
            self._emit_tracked(self._ctx, "optimizer_end", None)

    def _on_op(self, op: str, module: str | None) -> None:
        if self.deep and self._ctx is not None and self.tracker is not None:
            self._emit_tracked(self._ctx, op, module, op_bytes=self.tracker.op_bytes)

    def _on_budget_exceeded(self, info: BudgetExceeded) -> None:
        ctx = self._ctx
        if ctx is None:
            return
        data = dataclasses.asdict(info)
        data.update(
            kind="budget",
            message=f"{info.op} asked for {info.requested_bytes} bytes beyond the budget",
            frames=user_frames(traceback.extract_stack()),
            snapshot_path=None,
        )
        ctx.emit(Event(rank=ctx.rank, step=info.step, name="oom", data=data))

    # -- samples ---------------------------------------------------------------------------
    def _emit_tracked(
        self, ctx: AgentContext, event: str, module: str | None, *, step: int | None = None, force: bool = False,
        op_bytes: int | None = None,
    ) -> None:
        tracker = self.tracker
        if tracker is None or not (self.deep or self.continuous or force):
            return
        allocated = reserved = None
        if self.cuda:
            counters = allocator_counters(_cuda_index(ctx))
            allocated, reserved = counters["allocated_bytes"], counters["reserved_bytes"]
        now = time.perf_counter() - ctx.step_start
        step = ctx.step if step is None else step
        total = tracker.device_total()  # host copies of offload remedies are not device bytes
        if not self.deep:
            ctx.emit(MemorySample(rank=ctx.rank, step=step, time=now, event=event, module=module,
                                  categories=dict(tracker.totals), total_bytes=total, op_bytes=op_bytes,
                                  allocated_bytes=allocated, reserved_bytes=reserved))
            return
        # A deep step's samples (25,000 at 5001 modules) go as columns (advisor/records/table.py),
        # in MemorySample's field order (ROW_FIELDS).
        if self._rows.add_row(ctx.rank, step, (now, event, module, dict(tracker.totals), total, op_bytes,
                                                allocated, reserved, None, 1)):
            _emit_all(ctx, self._rows.take(close=False))

    def _light_categories(self, ctx: AgentContext) -> dict[str, int]:
        """Parameter and optimizer-state bytes (re-read every ``LIGHT_REFRESH_STEPS``) and
        gradient bytes now, from ``untyped_storage().nbytes()`` of the model's tensors."""
        if ctx.step - self._light_step >= LIGHT_REFRESH_STEPS or ctx.step < self._light_step:
            self._light_step = ctx.step
            sizes = dict.fromkeys(("parameter", "optimizer_state"), 0)
            seen: set[int] = set()
            for role, tensor in role_tensors(ctx.models(), ctx.optimizers()):
                found = storage_key(tensor)
                if role in sizes and found is not None and found[0] not in seen \
                        and not host_memory.is_offloaded(found[0]):  # an offload remedy's host copy
                    seen.add(found[0])
                    sizes[role] += found[1]
            self._light = sizes
            self._params = _parameters(ctx)
            self._grad_total = None
        categories = dict.fromkeys(MEMORY_CATEGORIES, 0)
        categories.update(self._light)
        categories["gradient"] = self._gradient_bytes()
        return categories

    def _gradient_bytes(self) -> int:
        """Bytes of the parameters' gradients now, without a walk over every parameter per step:
        gradients come and go together (``zero_grad(set_to_none=True)`` drops them all, a
        backward makes them all), so one parameter's gradient stands for all of them. The walk
        runs again when that gradient's size changes (a remedy resharded it), when the sizes
        are re-read (every ``LIGHT_REFRESH_STEPS``), or while no gradient was seen yet."""
        sentinel = self._grad_sentinel
        if sentinel is not None and self._grad_total is not None:
            grad = sentinel.grad
            if grad is None:
                return 0
            if local_part(grad).untyped_storage().nbytes() == self._sentinel_bytes:
                return self._grad_total
        total, first = 0, None
        for p in self._params:
            grad = p.grad
            if grad is not None:
                nbytes = local_part(grad).untyped_storage().nbytes()
                total += nbytes
                if first is None:
                    first = (p, nbytes)
        if first is not None:
            (self._grad_sentinel, self._sentinel_bytes), self._grad_total = first, total
        return total

    def _emit_light(self, ctx: AgentContext, phase: str) -> None:
        categories = self._light_categories(ctx)
        allocated = reserved = None
        if self.cuda:
            counters = allocator_counters(_cuda_index(ctx))
            allocated, reserved = counters["allocated_bytes"], counters["reserved_bytes"]
            known = sum(categories.values())
            categories["other"] = max(0, allocated - known)  # activations, temporaries, inputs
            categories["offloaded_host"] = host_memory.held_bytes()  # pinned host copies: not device bytes
        sample = MemorySample(
            rank=ctx.rank,
            step=ctx.step,
            time=time.perf_counter() - ctx.step_start,
            event=f"{phase}_start",
            categories=categories,
            total_bytes=sum(categories.values()) - categories["offloaded_host"],
            allocated_bytes=allocated,
            reserved_bytes=reserved,
        )
        for ready in self._series.offer(sample):
            ctx.emit(ready)

    def _cuda_view(self, ctx: AgentContext) -> dict[str, Any]:
        """Allocator counters plus NVML's view of this process (bytes; None where NVML cannot say)."""
        import os

        index = _cuda_index(ctx)
        view: dict[str, Any] = dict(allocator_view(index))
        uuid = device_uuid(index)
        used = self.nvml.process_used_bytes(index, os.getpid(), uuid)
        view["device_used_bytes"] = used
        view["device_used_outside_torch_bytes"] = (
            used - view["reserved_bytes"] if used is not None else None
        )
        view["device_total_used_bytes"] = self.nvml.device_used_bytes(index, uuid)
        return view


def infer_untracked(categories: dict[str, int], allocated: int | None, phase: str) -> dict[str, int]:
    """Add the allocator's bytes that no known category explains to the one the phase makes
    likely, in place; returns what was added. A light step knows parameters, gradients and
    optimizer state only; in a forward or backward with gradients the rest is overwhelmingly
    what autograd saved (activations), in the optimizer step its temporaries, elsewhere other."""
    rest = (allocated or 0) - sum(v for k, v in categories.items() if k != "offloaded_host")
    if rest <= 0:
        return {}
    category = {"forward": "activation", "backward": "activation", "optimizer": "temporary"}.get(phase, "other")
    categories[category] = categories.get(category, 0) + rest
    return {category: rest}


def _deep_next(ctx: AgentContext) -> bool:
    deep_next = getattr(ctx, "deep_next", None)  # optional: a context may not schedule
    return bool(deep_next is not None and deep_next())


def _emit_all(ctx: AgentContext, records: Iterable[Any]) -> None:
    for record in records:
        ctx.emit(record)


# The fields of a deep step's sample rows, in the order ``_emit_tracked`` gives them.
ROW_FIELDS = ("time", "event", "module", "categories", "total_bytes", "op_bytes", "allocated_bytes",
              "reserved_bytes", "device_used_bytes", "steps_covered")


def _parameters(ctx: AgentContext) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for model in ctx.models():
        for p in model.parameters():
            seen.setdefault(id(p), p)
    for opt in ctx.optimizers():
        for group in opt.param_groups:
            for p in group["params"]:
                seen.setdefault(id(p), p)
    return list(seen.values())


def _cuda_index(ctx: AgentContext) -> int:
    device = ctx.device
    if device.type == "cuda" and device.index is not None:
        return device.index
    return torch.cuda.current_device()
