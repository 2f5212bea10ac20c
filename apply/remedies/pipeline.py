"""A live pipeline inside one process: a chain of blocks split over devices, micro-batched.

``apply_pipeline(target, *, stages, micro_batches, devices)`` moves each stage's blocks to its
device at a step boundary and pipelines the chain's forward in GPipe style (torchgpipe ran an
unmodified loop the same way): the batch is split along its first dimension into m micro-batches
and one worker thread per stage runs them in order, so stage s works on micro-batch i while stage
s+1 works on micro-batch i-1. Autograd crosses devices by itself and runs each device's backward
on its own thread, so the user's ``loss.backward()`` and ``optimizer.step()`` are unchanged; the
output goes back to the input's device, so the loss code is too. Micro-batching reassociates sums
only (``live-equivalent``).

In place, like the other appliers: parameters and buffers move through ``.data`` (the user's
optimizer keeps the same Parameter objects), gradients and optimizer state tensors move with them,
and the blocks get an instance ``forward``: the first block's runs the whole pipeline, the others
hand their input through. ``revert()`` restores the forwards and every tensor's device.

Refused (``ValueError``, nothing changed) when the blocks are not consecutive children of one
``nn.Sequential`` / ``nn.ModuleList``, a block holds batch-coupled state (BatchNorm, instance norm
with running stats) or draws random numbers (dropout: worker threads would draw the masks in
another order), parameters are shared across stages, or the job runs several ranks. What needs
the batch is checked on the first forward after applying, which runs the blocks one by one on
their devices (same numerics as before): each block must receive the previous block's output,
the first block a single tensor, and the micro-batched chain must give that forward's output (a
first dimension that is not the batch fails this). If a check fails, the job keeps running the
blocks one by one across the devices (a plain model-parallel split) and ``handle.refusal`` says
why; the executor reverts on it. Later forwards whose input cannot be split run one by one too.

Repartition: ``apply_pipeline`` on a chain that a live handle already pipelines, with a new
``stages`` split of the same blocks in the same order, moves only the blocks whose stage changes to
their new stage's device (parameters, gradients, optimizer state, buffers, as at apply) at the step
boundary and returns a ``RepartitionHandle`` whose ``revert()`` moves them back to the previous
split (the pipeline stays). ``PipelineHandle.stage_times()`` gives the measured per-stage forward
seconds a new split is planned from (``recommend/remedies/pipeline_repartition.py``).

Not seen by the agent's per-module probes while pipelined: the blocks run inside the first
block's call, on worker threads (module hooks fire for the chain as a whole).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from advisor.apply.forward_patch import ForwardPatches
from advisor.apply.target import as_target

logger = logging.getLogger("advisor.apply")

PHASE = "layout"  # advisor.records.remedy.PHASES
TIMELINE = 4096  # (stage, micro_batch, start, end) records kept on the handle
REPORT_EVERY = 8  # pipelined forwards between two ``pipeline_stages`` reports to the controller
_MARK = "__advisor_pipeline__"
_NORMS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)
_DROPOUT = (nn.modules.dropout._DropoutNd,)
_LIVE: "weakref.WeakKeyDictionary[nn.Module, PipelineHandle]" = weakref.WeakKeyDictionary()  # block -> its live split


def _move_tensor(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The one place a tensor changes device (tests inject a failure here)."""
    return t.to(device)


@dataclass(eq=False)
class PipelineHandle:
    """What ``apply_pipeline`` changed. ``timeline``: (stage, micro_batch, start, end) of each
    stage's work, ``time.perf_counter()`` seconds (on CUDA: when the kernels were queued)."""

    stages: tuple[tuple[str, ...], ...]
    devices: tuple[torch.device, ...]
    micro_batches: int
    mode: str = "verify"  # verify -> pipeline, or sequential (refusal set); reverted
    refusal: str | None = None
    pipelined_forwards: int = 0
    timeline: deque = field(default_factory=lambda: deque(maxlen=TIMELINE))
    _moves: list[Callable[[], None]] = field(default_factory=list, repr=False)  # undo, in order
    _patches: ForwardPatches = field(default_factory=lambda: ForwardPatches(_MARK, "the pipeline split"), repr=False)
    _blocks: list[tuple[nn.Module, Any, int]] = field(default_factory=list, repr=False)  # module, forward, stage
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    notify: Any = None  # the target's notify(name, data): the agent's emit; None where nobody listens

    def report(self) -> None:
        """Send ``describe()`` as a ``pipeline_stages`` event (the repartition rule reads the last)."""
        if callable(self.notify):
            self.notify("pipeline_stages", self.describe())

    def revert(self) -> None:
        """Restore every block's forward and every moved tensor's device; safe to call twice."""
        if self.mode == "reverted":
            return
        self._patches.restore()
        errors = []
        for undo in reversed(self._moves):
            try:
                undo()
            except Exception as exc:  # keep going: restore as much as can be restored
                errors.append(exc)
        self._moves.clear()
        for module, _, _ in self._blocks:
            if _LIVE.get(module) is self:
                del _LIVE[module]
        self.mode = "reverted"
        self.report()  # the split is gone: the rule must not rebalance it
        logger.info("Reverted the pipeline split of %d stages", len(self.stages))
        if errors:
            raise RuntimeError(f"pipeline revert could not move {len(errors)} tensor(s) back: {errors[0]}")

    def describe(self) -> dict[str, Any]:
        return {"remedy": "pipeline", "stages": [list(s) for s in self.stages], "micro_batches": self.micro_batches,
                "devices": [str(d) for d in self.devices], "mode": self.mode, "refusal": self.refusal,
                "pipelined_forwards": self.pipelined_forwards, "stage_times_s": list(self.stage_times())}

    def stage_times(self) -> tuple[float, ...]:
        """Measured seconds each stage's worker spends per pipelined forward (all its micro-batches,
        whole batch), averaged over the timeline since the last (re)partition; 0 where none ran."""
        with self._lock:
            entries = list(self.timeline)
        busy = [0.0] * len(self.stages)
        forwards = [0] * len(self.stages)
        for stage, micro_batch, start, end in entries:
            busy[stage] += end - start
            forwards[stage] += micro_batch == 0
        return tuple(b / f if f else 0.0 for b, f in zip(busy, forwards))


@dataclass(eq=False)
class RepartitionHandle:
    """A new split of a live pipeline; ``revert()`` moves the blocks back to the previous one."""

    pipeline: PipelineHandle
    previous: tuple[tuple[tuple[str, ...], ...], tuple[torch.device, ...], int]
    states: dict[nn.Parameter, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    reverted: bool = False

    def revert(self) -> None:
        if self.reverted:
            return
        self.reverted = True
        if self.pipeline.mode != "reverted":  # the whole split was undone already: nothing to move
            _move_stages(self.pipeline, *self.previous, self.states)
            self.pipeline.report()
        logger.info("Reverted the pipeline repartition to stages %s", [len(s) for s in self.previous[0]])

    def describe(self) -> dict[str, Any]:
        return {**self.pipeline.describe(), "previous_stages": [list(s) for s in self.previous[0]]}


# ------------------------------------------------------------------------- checks -----------
def _resolve(target: Any, names: list[str]) -> tuple[nn.Module, list[nn.Module]]:
    for root in as_target(target).models:
        table = dict(root.named_modules())
        if all(n in table for n in names):
            return root, [table[n] for n in names]
    roots = as_target(target).models
    known = [n for root in roots for n, _ in root.named_children()]
    missing = [n for n in names if not any(n in dict(r.named_modules()) for r in roots)]
    if not missing:
        raise ValueError(f"the blocks {names} are spread over several models; a chain lives in one")
    raise ValueError(f"no block {missing[0]!r} in the job's models; top-level modules: {known[:10]}")


def _check_chain(root: nn.Module, names: list[str], blocks: list[nn.Module]) -> None:
    parents = {n.rpartition(".")[0] for n in names}
    if len(parents) != 1:
        raise ValueError(f"the chain is not a sequence of blocks each feeding the next: {names} have "
                         f"different parents {sorted(parents)}")
    parent = root.get_submodule(parents.pop())
    if not isinstance(parent, (nn.Sequential, nn.ModuleList)):
        raise ValueError(f"the chain is not a sequence of blocks each feeding the next: their parent is a "
                         f"{type(parent).__name__}, not an nn.Sequential or nn.ModuleList")
    children = list(parent._modules.values())
    start = next((i for i, c in enumerate(children) if c is blocks[0]), -1)
    if children[start:start + len(blocks)] != blocks or len({id(b) for b in blocks}) != len(blocks):
        raise ValueError(f"the chain is not a sequence of blocks each feeding the next: {names} are not "
                         f"consecutive children of their {type(parent).__name__} in order")
    for name, block in zip(names, blocks):
        for sub_name, sub in block.named_modules():
            where = f"{name}.{sub_name}" if sub_name else name
            if isinstance(sub, _NORMS) and getattr(sub, "track_running_stats", False):
                raise ValueError(f"{where} is a {type(sub).__name__}: its batch statistics would be taken per "
                                 "micro-batch, which changes training; a pipeline split needs batch-independent blocks")
            if isinstance(sub, _DROPOUT) and sub.p > 0:
                raise ValueError(f"{where} is a {type(sub).__name__}(p={sub.p}): worker threads would draw its "
                                 "masks in another order, which changes training (set p=0 or opt in to a restart)")


def _devices(devices: Sequence[str], stages: int) -> tuple[torch.device, ...]:
    if isinstance(devices, str) or len(devices) != stages:
        raise ValueError(f"devices must list one device per stage ({stages}), not {devices!r}")
    out = []
    for d in devices:
        dev = torch.device(d)
        if dev.type == "cuda":
            if not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count():
                raise ValueError(f"device {d!r} is not visible; this process sees "
                                 f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA device(s)")
            dev = torch.device("cuda", dev.index or 0)
        out.append(dev)
    return tuple(out)


# ------------------------------------------------------------------------- moves ------------
def _move_module(handle: PipelineHandle, block: nn.Module, device: torch.device,
                 states: dict[nn.Parameter, list[dict[str, Any]]]) -> None:
    """Move ``block``'s parameters, gradients, optimizer state and buffers, recording the undo."""
    for param in block.parameters():
        old = param.device
        if old == device:
            continue
        grad = param.grad
        param.grad = None
        moved = _move_tensor(param.data, device)
        param.data = moved
        handle._moves.append(lambda p=param, o=old: _set_data(p, o))
        if grad is not None:
            param.grad = _move_tensor(grad, device)
        for state in states.get(param, []):
            for key, value in list(state.items()):
                # Adam's scalar "step" lives on the CPU unless capturable/fused: leave such scalars.
                if torch.is_tensor(value) and value.device == old and not (value.dim() == 0 and old.type == "cpu"):
                    state[key] = _move_tensor(value, device)
                    handle._moves.append(lambda s=state, k=key, o=old: s.__setitem__(k, s[k].to(o)))
    for buf in block.buffers():
        old = buf.device
        if old != device:
            buf.data = _move_tensor(buf.data, device)
            handle._moves.append(lambda b=buf, o=old: setattr(b, "data", b.data.to(o)))


def _move_stages(handle: PipelineHandle, stages: tuple[tuple[str, ...], ...], devices: tuple[torch.device, ...],
                 micro_batches: int, states: dict[nn.Parameter, list[dict[str, Any]]]) -> None:
    """Give the live split ``handle`` new stages: the blocks whose stage changes move to their new
    stage's device. Atomic: on a failure the blocks already moved go back and it raises."""
    target = [s for s, stage in enumerate(stages) for _ in stage]
    before = (handle.stages, handle.devices, handle.micro_batches, list(handle._blocks))
    try:
        for k, (module, forward, old) in enumerate(handle._blocks):
            if target[k] != old or devices[target[k]] != handle.devices[old]:
                _move_module(handle, module, devices[target[k]], states)
            handle._blocks[k] = (module, forward, target[k])
    except BaseException:
        for module, _, old in before[3]:  # a no-op for every tensor still where it was
            _move_module(handle, module, before[1][old], states)
        handle.stages, handle.devices, handle.micro_batches, handle._blocks[:] = before
        raise
    handle.stages, handle.devices, handle.micro_batches = stages, devices, micro_batches
    with handle._lock:
        handle.timeline.clear()  # stage times of the old split say nothing about the new one


def _set_data(param: nn.Parameter, device: torch.device) -> None:
    grad = param.grad
    param.grad = None
    param.data = param.data.to(device)
    if grad is not None:
        param.grad = grad.to(device)


# ------------------------------------------------------------------------- running ----------
class _Runner:
    """The patched forwards of the chain's blocks and the pipelined run."""

    def __init__(self, handle: PipelineHandle) -> None:
        self.h = handle
        self.expect: Any = None  # the object the next block must receive
        self.index = 0  # the next block to be called in this forward
        self.first_input: torch.Tensor | None = None
        self.sequential_now = False  # this forward runs block by block

    # The first block's forward: the whole chain, or its own part when running block by block.
    def head(self, *args: Any, **kwargs: Any) -> Any:
        h = self.h
        x = args[0] if len(args) == 1 and not kwargs and torch.is_tensor(args[0]) else None
        self.index, self.expect = 0, None
        if h.mode == "verify" and (x is None or x.dim() == 0):
            self._refuse("the first block is not called with a single tensor whose first dimension is the batch")
        self.sequential_now = h.mode != "pipeline" or x is None or x.dim() == 0
        if self.sequential_now:
            self.first_input = x if h.mode == "verify" else None
            return self.block(0, *args, **kwargs)
        out = self.run(x)
        h.pipelined_forwards += 1
        if h.pipelined_forwards % REPORT_EVERY == 0:
            h.report()
        self.index, self.expect = 1, out
        return out

    def passing(self, k: int, *args: Any, **kwargs: Any) -> Any:
        if self.sequential_now:
            return self.block(k, *args, **kwargs)
        if self.index != k or len(args) != 1 or kwargs or args[0] is not self.expect:
            raise RuntimeError(f"pipeline split: block {k} did not receive block {k - 1}'s output in this forward "
                               "(the chain changed since the split was verified); revert the pipeline remedy")
        self.index += 1
        return args[0]

    def block(self, k: int, *args: Any, **kwargs: Any) -> Any:
        """Block k on its stage's device, its output back on the caller's device (verify, sequential)."""
        h = self.h
        module, forward, stage = h._blocks[k]
        chained = self.index == k and (k == 0 or (len(args) == 1 and not kwargs and args[0] is self.expect))
        if h.mode == "verify" and not chained:
            self._refuse(f"block {k} did not receive block {k - 1}'s output: the blocks do not feed each other")
        first = next((a for a in args if torch.is_tensor(a)), None)
        device = h.devices[stage]
        args = tuple(_move_tensor(a, device) if torch.is_tensor(a) else a for a in args)
        out = forward(*args, **kwargs)
        if first is not None and torch.is_tensor(out):
            out = _move_tensor(out, first.device)
        self.index, self.expect = k + 1, out
        if h.mode == "verify" and k == len(h._blocks) - 1:
            self._verify(out)
        return out

    def _verify(self, out: Any) -> None:
        x, self.first_input = self.first_input, None
        if self.h.mode != "verify" or x is None or not torch.is_tensor(out):
            return
        if x.shape[0] < 2:
            return self._refuse(f"the batch has {x.shape[0]} sample(s) along its first dimension: nothing to split")
        cuda = sorted({d.index for d in self.h.devices if d.type == "cuda"})
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):  # leaves every generator as it was
            split = self.run(x.detach(), record=False)
        scale = float(out.detach().abs().max()) if out.numel() else 0.0
        if split.shape != out.shape or not torch.allclose(split, out.detach(), rtol=1e-4, atol=1e-5 * (scale + 1e-30)):
            return self._refuse("the chain's output changes when the batch is split along its first dimension "
                                "(it is not the batch dimension, or a block mixes samples)")
        self.h.mode = "pipeline"
        logger.info("Pipeline split verified on one forward; pipelining from the next")

    def _refuse(self, why: str) -> None:
        if self.h.mode == "verify":
            self.h.mode, self.h.refusal = "sequential", why
            logger.warning("Pipeline split refused (%s); the blocks run one by one on their devices", why)

    def run(self, x: torch.Tensor, *, record: bool = True) -> torch.Tensor:
        """GPipe forward: one worker thread per stage, micro-batches through queues in order."""
        h = self.h
        p = len(h.stages)
        chunks = x.tensor_split(min(h.micro_batches, x.shape[0]))
        m = len(chunks)
        by_stage: list[list[Callable[..., Any]]] = [[] for _ in range(p)]
        for _, forward, stage in h._blocks:
            by_stage[stage].append(forward)
        queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(p + 1)]
        grad = torch.is_grad_enabled()
        autocast = {dt: (torch.is_autocast_enabled(dt), torch.get_autocast_dtype(dt))
                    for dt in {d.type for d in h.devices} if dt in ("cuda", "cpu")}

        def work(s: int) -> None:
            device = h.devices[s]
            with _thread_state(device, grad, autocast):
                for _ in range(m):
                    item = queues[s].get()
                    if isinstance(item, BaseException):
                        queues[s + 1].put(item)
                        return
                    i, t = item
                    try:
                        start = time.perf_counter()
                        t = _move_tensor(t, device)
                        for forward in by_stage[s]:
                            t = forward(t)
                        if record:
                            with h._lock:
                                h.timeline.append((s, i, start, time.perf_counter()))
                    except BaseException as exc:  # handed on: the caller re-raises it
                        queues[s + 1].put(exc)
                        return
                    queues[s + 1].put((i, t))

        threads = [threading.Thread(target=work, args=(s,), name=f"advisor-pipeline-{s}", daemon=True)
                   for s in range(p)]
        for t in threads:
            t.start()
        for i, chunk in enumerate(chunks):
            queues[0].put((i, chunk))
        outs: list[torch.Tensor] = []
        error: BaseException | None = None
        for _ in range(m):
            item = queues[p].get()
            if isinstance(item, BaseException):
                error = item
                break
            outs.append(item[1])
        for t in threads:
            t.join()
        if error is not None:
            raise error
        return torch.cat([_move_tensor(o, x.device) for o in outs], dim=0)


class _thread_state:
    """The caller's grad mode, autocast and device on a worker thread (all three are per thread)."""

    def __init__(self, device: torch.device, grad: bool, autocast: dict[str, tuple[bool, torch.dtype]]) -> None:
        self.stack = [torch.set_grad_enabled(grad)]
        self.stack += [torch.autocast(dt, dtype=dtype, enabled=on) for dt, (on, dtype) in autocast.items()]
        if device.type == "cuda":
            self.stack.append(torch.cuda.device(device))

    def __enter__(self) -> None:
        for ctx in self.stack:
            ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        for ctx in reversed(self.stack):
            ctx.__exit__(*exc)


# ------------------------------------------------------------------------- entry point ------
def apply_pipeline(target: Any, *, stages: list[list[str]], micro_batches: int, devices: list[str]) -> PipelineHandle:
    """Split the chain named by ``stages`` over ``devices`` and pipeline it in ``micro_batches``;
    on a chain a live split already pipelines, repartition it (a ``RepartitionHandle``).

    ``target``: an ``advisor.apply.target.Target`` (or a bare model).
    Atomic: either a handle is returned, or ``ValueError`` (refused) / the failure is raised with
    every block, tensor and forward as it was.
    """
    if isinstance(stages, str) or len(stages) < 2 or any(isinstance(s, str) or not s for s in stages):
        raise ValueError(f"stages must be two or more non-empty lists of block names, not {stages!r}")
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be an integer >= 1, not {micro_batches!r}")
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        raise ValueError("the job runs several ranks: a pipeline over ranks changes every rank's loop (restart class)")
    names = [n for s in stages for n in s]
    if len(set(names)) != len(names):
        raise ValueError(f"stages name a block twice: {names}")
    devs = _devices(devices, len(stages))
    root, blocks = _resolve(target, names)
    _check_chain(root, names, blocks)
    owner: dict[int, int] = {}
    for s, stage in enumerate(stages):
        for block in blocks[sum(len(x) for x in stages[:s]):][:len(stage)]:
            for param in block.parameters():
                if owner.setdefault(id(param), s) != s:
                    raise ValueError("a parameter is shared by blocks of different stages (tied weights); "
                                     "put those blocks in one stage")
    chain_ids = {id(q) for b in blocks for q in b.modules()}
    outside = {id(q) for sub in root.modules() if id(sub) not in chain_ids for q in sub.parameters(recurse=False)}
    if outside & set(owner):
        raise ValueError("a block shares a parameter with a module outside the chain (tied weights); "
                         "moving it would leave that module on another device")
    states: dict[nn.Parameter, list[dict[str, Any]]] = {}
    for opt in as_target(target).optimizers:
        for param, state in opt.state.items():
            states.setdefault(param, []).append(state)
    live = {id(h): h for h in (_LIVE.get(b) for b in blocks) if h is not None}
    if live:
        current = next(iter(live.values()))
        if len(live) > 1 or [m for m, _, _ in current._blocks] != blocks:
            raise ValueError("some of these blocks are already pipelined as another chain; revert that split first")
        previous = (current.stages, current.devices, current.micro_batches)
        _move_stages(current, tuple(tuple(s) for s in stages), devs, micro_batches, states)
        current.report()  # no times yet for the new split: the rule waits for the next report
        logger.info("Repartitioned the pipeline: stages %s -> %s", [len(s) for s in previous[0]],
                    [len(s) for s in stages])
        return RepartitionHandle(pipeline=current, previous=previous, states=states)  # type: ignore[return-value]
    handle = PipelineHandle(stages=tuple(tuple(s) for s in stages), devices=devs, micro_batches=micro_batches,
                            notify=getattr(as_target(target), "notify", None))
    runner = _Runner(handle)
    try:
        k = 0
        for s, stage in enumerate(stages):
            for _ in stage:
                block = blocks[k]
                _move_module(handle, block, devs[s], states)
                handle._blocks.append((block, block.forward, s))
                handle._patches.patch(names[k], block, runner.head if k == 0 else functools.partial(runner.passing, k))
                k += 1
    except BaseException:
        handle.revert()  # leave nothing half-applied
        raise
    for block in blocks:
        _LIVE[block] = handle
    logger.info("Applied a pipeline split: %d stages on %s, %d micro-batches",
                len(stages), ", ".join(map(str, devs)), micro_batches)
    return handle
