"""Forward time of the model's numbered modules, measured on sampled light steps.

The checkpointing remedy's recompute cost is one more forward of each checkpointed block. Deep
steps time every module, but under the dispatch modes and saved-tensor hooks that make them
3-6x slower, unevenly per module; scaling by one light/deep ratio misjudged the cost by 10-60%
(issue 14). So on one light step in ``every`` the agent subscribes this timer to its module
events and times the forward of the numbered members of containers (``blocks.3``,
``stages.0.1``): the modules the recommender can take as a chain's blocks. Every other light
step runs no code of this module: the light path stays the agent's own push and pop.

On a timed step only the timed modules' calls reach the timer (the agent lifts its global hooks
from every other call, advisor/agent/forward_hooks.py, so a block runs as on a light step); each
costs a ``perf_counter`` pair. Forwards run inside backward (checkpoint recomputation) and evaluation
forwards are not counted: the figure is the training forward, summed over the step's calls.

The same steps measure what a checkpoint's recomputation of each module costs. PyTorch's
non-reentrant checkpoint stops the recomputation once the last tensor the forward saved has been
saved again (its early stop, on by default): a GPT block's last matmul, whose input its backward
needs but whose output nothing saved, never runs again, and recomputing the block cost 0.78-0.85
of its forward on this CPU (examples/gpt.py at hidden 256; 0.97 at the default 128, where Python
dominates). So while it times, the timer also holds saved-tensor hooks that mark each save
(a detached alias packed, one clock read or a re-recorded event per save), and each module's
recompute span runs from the start of its ``forward`` to its last save (``recompute``). The start
is marked by a forward pre-hook the timer puts last on each timed module that has hooks of its own
(or when another global pre-hook runs) while it times, elsewhere by the call's start: a
checkpoint runs the module's forward again, not its hooks, and a ``fully_shard``ed layer's
pre-hook waits for its parameters' all-gather, which the recomputation inside the layer's
backward does not repeat (the forward span, from the call's start, still holds it: the zoo's
FSDP2 layers' recompute was read 3x what it cost). A module whose saves it never saw (its own
checkpoint's hooks hid them, or the script disabled saved-tensor hooks) gets no span: the forward
stands for it.

On CUDA the host clock would time the kernel launches, not the kernels: there each timed call
records a pair of timing events on the current stream instead, and ``stop`` returns a
``DeviceTimes`` that the agent resolves when the step's loss copy has completed (the events
were recorded before it), so timing adds no device synchronisation.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from advisor.probes import saved_hooks

Unsubscribe = Callable[[], None]


def numbered(name: str) -> bool:
    """Whether a qualified module name is a numbered member of a container (``blocks.3``)."""
    return name.rpartition(".")[2].isdigit()


def timing_event(device: torch.device | None) -> Any:
    """A timing event recorded now on ``device``'s current stream (the current device's when
    None). The job's device, not the current one: a rank whose model is on ``cuda:1`` without
    ``torch.cuda.set_device`` would otherwise time device 0's idle stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def _sum(pairs: list[tuple[str, Any, Any]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for name, start, end in pairs:
        end.synchronize()
        totals[name] = totals.get(name, 0.0) + start.elapsed_time(end) / 1e3
    return totals


class DeviceTimes:
    """A CUDA step's timed calls: (name, start event, end event) for the forwards and (name, start
    event, last save's event) for the recompute spans, read once the events are done."""

    def __init__(self, pairs: list[tuple[str, Any, Any]], recompute: list[tuple[str, Any, Any]] | None = None) -> None:
        self.pairs = pairs
        self.recompute = recompute or []

    def resolve(self) -> tuple[dict[str, float], dict[str, float]]:
        """Forward and recompute seconds per module name (waits for any event not done yet: the
        agent calls it once the step's later event has completed, or at exit)."""
        return _sum(self.pairs), _sum(self.recompute)


class BlockTimer:
    """Sums the forward seconds of selected modules over one step."""

    def __init__(self, *, counting: Callable[[], bool]) -> None:
        # ``counting``: whether a forward now is the training forward (not an evaluation pass).
        self._counting = counting
        self._names: dict[int, str] = {}
        # (module id, call's start mark, saves before it, its forward's start mark once its hooks ran)
        self._stack: list[tuple[int, Any, int, Any]] = []
        self._local: list[Any] = []  # the forward-start pre-hooks' handles while timing
        self._late: set[int] = set()  # ids of the modules that have one (their forward starts after other hooks)
        self.totals: dict[str, float] = {}
        self._pairs: list[tuple[str, Any, Any]] = []
        self.recompute: dict[str, float] = {}
        self._recompute_pairs: list[tuple[str, Any, Any]] = []
        self._device: torch.device | None = None  # a CUDA device: timing events on its stream
        self._unsubscribe: Unsubscribe | None = None
        self._hooks: Any = None  # the saved-tensor hooks while timing (thread-local: pushed on _thread)
        self._thread: int | None = None
        self._saves = 0  # saves seen while a timed module was open
        self._last: Any = None  # the last save's clock reading, or its event on CUDA
        self._last_taken = False  # a module holds ``_last`` (an event): the next save records a new one

    @property
    def active(self) -> bool:
        return self._unsubscribe is not None

    def start(self, modules: dict[int, tuple[str, Any]], subscribe: Callable[[Any, Any, list], Unsubscribe], *,
              device: torch.device | None = None) -> None:
        """Time ``modules`` (id(module) -> (qualified name, weak reference)) until ``stop``; on a
        CUDA ``device``, by timing events on its current stream, else by the host's clock."""
        self._names = {key: name for key, (name, _) in modules.items()}
        # The forward-start pre-hook only where a hook runs between the call's start and its forward
        # (a module's own pre-hooks: FSDP's all-gather; another global pre-hook than the agent's).
        # Elsewhere the call's start is its forward's: 5000 handles per timed step at 5001 modules
        # (0.05 s, and the objects pushed a full garbage collection into the step).
        others = len(torch.nn.modules.module._global_forward_pre_hooks) > 1
        forward_start = self._forward_start
        self._late = set()
        for key, (_, ref) in modules.items():
            if (module := ref()) is not None and (others or module._forward_pre_hooks):
                self._local.append(module.register_forward_pre_hook(forward_start))
                self._late.add(key)
        self._stack = []
        self.totals, self.recompute = {}, {}
        self._pairs, self._recompute_pairs = [], []
        self._saves, self._last, self._last_taken = 0, None, False
        self._device = device if device is not None and device.type == "cuda" else None
        try:
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            saved_hooks.push(hooks)  # steps aside for torch.func's transforms
            self._hooks, self._thread = hooks, threading.get_ident()
        except RuntimeError:  # the script disabled saved-tensor hooks: forward times only
            self._hooks = None
        # The timed modules only: the agent lifts its hooks from every other module's call
        # (advisor/agent/forward_hooks.py), so a block is timed as a light step runs it.
        self._unsubscribe = subscribe(self.pre, self.post, [m for _, ref in modules.values() if (m := ref()) is not None])

    def stop(self) -> tuple[dict[str, float], dict[str, float]] | DeviceTimes:
        """Stop timing; the step's forward and recompute seconds per module name (empty when none
        ran), or on CUDA the events to resolve once they are done."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for handle in self._local:
            handle.remove()
        self._local, self._late = [], set()
        if self._hooks is not None and self._thread == threading.get_ident():
            saved_hooks.pop(self._hooks)  # another thread (an exit handler) cannot pop this one's
        self._hooks = self._thread = None
        totals, recompute, pairs, spans = self.totals, self.recompute, self._pairs, self._recompute_pairs
        self.totals, self.recompute, self._pairs, self._recompute_pairs = {}, {}, [], []
        self._stack, self._names, self._last = [], {}, None
        return DeviceTimes(pairs, spans) if self._device is not None and pairs else (totals, recompute)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._stack:
            self._saves += 1
            if self._device is None:
                self._last = time.perf_counter()
            else:
                if self._last is None or self._last_taken:
                    self._last, self._last_taken = torch.cuda.Event(enable_timing=True), False
                self._last.record(torch.cuda.current_stream(self._device))
        # A detached alias, not the tensor: an op's saved output packed as itself holds its own
        # grad_fn, a cycle Python cannot collect, so a forward that never ran backward (a metric
        # computed with gradients on) kept its whole graph. Autograd rebuilds the unpacked
        # tensor's history from its own record, so gradients, double backward included, are equal.
        return tensor.detach()

    def _mark(self) -> Any:
        return timing_event(self._device) if self._device is not None else time.perf_counter()

    def pre(self, module: torch.nn.Module, args: Any) -> None:
        key = id(module)
        if key in self._names and torch._C._current_graph_task_id() == -1 and self._counting():
            mark = self._mark()
            self._stack.append((key, mark, self._saves, None if key in self._late else mark))

    def _forward_start(self, module: torch.nn.Module, args: Any) -> None:
        """The module's last pre-hook: its other hooks are done and its forward starts."""
        if self._stack and self._stack[-1][0] == id(module) and self._stack[-1][3] is None:
            key, start, saves, _ = self._stack[-1]
            self._stack[-1] = (key, start, saves, self._mark())

    def post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._stack and self._stack[-1][0] == id(module):
            key, start, saves, body = self._stack.pop()
            name = self._names[key]
            end = self._mark()
            last = self._last if self._saves > saves else None
            body = start if body is None else body
            if self._device is not None:
                self._pairs.append((name, start, end))
                if last is not None:
                    self._recompute_pairs.append((name, body, last))
                    self._last_taken = True
            else:
                self.totals[name] = self.totals.get(name, 0.0) + (end - start)
                if last is not None:
                    self.recompute[name] = self.recompute.get(name, 0.0) + (last - body)


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
