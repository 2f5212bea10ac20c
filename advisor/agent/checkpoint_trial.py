"""What checkpointing a block really costs, measured on a copy of it at a step boundary.

The recompute cost the recommender priced was one more forward of each checkpointed block (its
light-step span). On small and host-bound blocks the checkpoint's own machinery costs as much
again or more: non-reentrant ``torch.utils.checkpoint`` packs every tensor the forward saves into a
holder, re-runs the forward inside backward under hooks that store each recomputed tensor, and
stashes the RNG state. The zoo's Hugging Face GPT-2 block (width 32, 30 saves) ran forward in
0.71 ms and forward plus backward in 1.29 ms; checkpointed, in 3.40 ms: 2.1 ms more, three
forwards, where one was priced (tests/test_checkpoint_trial.py; the trial on a model that size).
No constant per call or per save carries across blocks (12 us per save for a chain of multiplies,
about 40 for the GPT-2 block, on this CPU), so it is measured.

On the timed light step (``advisor/agent/block_timer.py``), one numbered module of each type
(``representatives``) has its first training call's arguments copied (detached tensors with their
``requires_grad``, the autocast state). At the boundary after it, ``run_trial`` deep-copies the
module and times, on those arguments, forward alone, forward and backward, and the same
checkpointed, alternating, under the RNG's fork (the script's random stream is untouched), with
the agent's hooks off and the probes quiet (``quiet`` context managers: the memory tracker paused,
the CUDA peak reset after). The figure is ``ratio``: (checkpointed - plain forward and backward) /
plain forward, which the recommender multiplies by each same-type block's own light-step forward
(``recommend/memory_model.recompute_seconds``). A module whose parameters are not plain tensors
(FSDP2's DTensors, a ``fully_shard``ed layer) or that is larger than ``MAX_BYTES`` is not copied:
its span stands as before. Runs only where a memory budget is set (where checkpointing is
offered), once per module type.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable

import torch

MAX_BYTES = 256 << 20  # a block larger than this (parameters and buffers) is not copied
TRIAL_S = 0.05  # about how long the timed repetitions of one block may take
MAX_REPS = 20


def representatives(modules: dict[int, tuple[str, Any]], done: set[str]) -> dict[str, tuple[str, torch.nn.Module]]:
    """type name -> (qualified name, module): the first numbered module of each type not tried yet."""
    out: dict[str, tuple[str, torch.nn.Module]] = {}
    for name, ref in sorted(modules.values(), key=lambda item: item[0]):
        module = ref()
        kind = type(module).__name__ if module is not None else None
        if kind is not None and kind not in done and kind not in out and _copyable(module):
            out[kind] = (name, module)
    return out


def _copyable(module: torch.nn.Module) -> bool:
    if any(cls.__name__.startswith("FSDP") for cls in type(module).__mro__):
        return False
    size = 0
    for tensor in [*module.parameters(), *module.buffers()]:
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.is_meta:
            return False
        size += tensor.numel() * tensor.element_size()
    return size <= MAX_BYTES


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and type(value) is not torch.nn.Parameter:
            raise TypeError("a tensor subclass argument")
        out = value.detach().clone()
        return out.requires_grad_(value.requires_grad and value.is_floating_point())
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


class InputCapture:
    """Copies the first training call's arguments of each representative while a step is timed."""

    def __init__(self, chosen: dict[str, tuple[str, torch.nn.Module]]) -> None:
        self.chosen = chosen
        self.inputs: dict[str, tuple[Any, Any, Any]] = {}  # type name -> (args, kwargs, autocast state)
        self._handles = [module.register_forward_pre_hook(self._hook(kind), with_kwargs=True)
                         for kind, (_, module) in chosen.items()]

    def _hook(self, kind: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if kind in self.inputs or not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
                return
            try:
                self.inputs[kind] = (_detached(args), _detached(kwargs), _autocast_state())
            except TypeError:
                self.inputs[kind] = None  # type: ignore[assignment]
        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _autocast_state() -> tuple[str, torch.dtype] | None:
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            return device, torch.get_autocast_dtype(device)
    return None


def _loss(output: Any) -> torch.Tensor | None:
    """A scalar to run backward from: the sum of the first floating tensor that needs a gradient."""
    if isinstance(output, torch.Tensor):
        return output.float().sum() if output.requires_grad else None
    if isinstance(output, (list, tuple)):
        for item in output:
            if (found := _loss(item)) is not None:
                return found
    if isinstance(output, dict):
        for item in output.values():
            if (found := _loss(item)) is not None:
                return found
    return None


def run_trial(module: torch.nn.Module, args: Any, kwargs: Any, autocast: Any,
              device: torch.device | None) -> dict[str, float] | None:
    """Seconds of plain forward, plain forward and backward, and checkpointed forward and
    backward of a copy of ``module`` on ``args``/``kwargs`` (medians of alternating repetitions),
    and their ``ratio``; None when it cannot run (nothing to differentiate, an error)."""
    from torch.utils.checkpoint import checkpoint

    cuda = device is not None and device.type == "cuda"
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if cuda else []
    with torch.random.fork_rng(devices=devices, device_type="cuda" if cuda else "cpu"):
        clone = copy.deepcopy(module)  # its own hooks too (the user's are part of its cost)
        clone.train(module.training)
        ctx = (torch.autocast(autocast[0], dtype=autocast[1]) if autocast else _Null())

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(device)

        def forward() -> None:
            with ctx:
                clone(*args, **kwargs)

        def plain() -> None:
            with ctx:
                loss = _loss(clone(*args, **kwargs))
            loss.backward()  # type: ignore[union-attr]

        def checkpointed() -> None:
            with ctx:
                loss = _loss(checkpoint(clone, *args, use_reentrant=False, **kwargs))
            loss.backward()  # type: ignore[union-attr]

        with ctx:
            if _loss(clone(*args, **kwargs)) is None:
                return None
        runs = (forward, plain, checkpointed)
        for fn in runs:  # warm-up: first-call costs, the checkpoint's lazy imports
            fn()
        sync()
        start = time.perf_counter()
        plain()
        sync()
        reps = max(2, min(MAX_REPS, int(TRIAL_S / max(time.perf_counter() - start, 1e-6) / 3)))
        times: dict[Callable[[], None], list[float]] = {fn: [] for fn in runs}
        for _ in range(reps):
            for fn in runs:
                sync()
                start = time.perf_counter()
                fn()
                sync()
                times[fn].append(time.perf_counter() - start)
        clone.zero_grad(set_to_none=True)
    fwd, fb, ck = (sorted(times[fn])[len(times[fn]) // 2] for fn in runs)
    if fwd <= 0:
        return None
    return {"forward_s": fwd, "plain_s": fb, "checkpoint_s": ck, "ratio": max(0.0, (ck - fb) / fwd), "reps": reps}


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


class CheckpointTrials:
    """The agent's side: ``start`` while a step is timed, ``finish`` at the boundary after it;
    each module type is tried once (a failed trial is not tried again)."""

    def __init__(self) -> None:
        self._tried: set[str] = set()
        self._capture: InputCapture | None = None

    def start(self, modules: dict[int, tuple[str, Any]]) -> None:
        chosen = representatives(modules, self._tried)
        self._capture = InputCapture(chosen) if chosen else None

    def finish(self, quiet: Callable[[], Any], device: torch.device | None) -> dict[str, dict[str, Any]]:
        """type name -> {"module", "forward_s", "plain_s", "checkpoint_s", "ratio", "reps"} for
        the modules whose call was seen on the timed step."""
        capture, self._capture = self._capture, None
        if capture is None:
            return {}
        capture.remove()
        out: dict[str, dict[str, Any]] = {}
        for kind, found in capture.inputs.items():
            self._tried.add(kind)
            if found is None:
                continue
            name, module = capture.chosen[kind]
            try:
                with quiet():
                    figures = run_trial(module, *found, device)
            except Exception:  # the copy's forward or backward failed: its span stands
                continue
            if figures is not None:
                out[kind] = {"module": name, **figures}
        return out

    def stop(self) -> None:
        if self._capture is not None:
            self._capture.remove()
            self._capture = None
