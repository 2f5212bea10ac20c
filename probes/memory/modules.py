"""Per-module attribution on deep-sampled steps: a module stack from global forward hooks.

What each ``ModuleStat`` field measures:

- ``parameter_bytes``: storage bytes of the module's parameters, its submodules' included
  (``Module.parameters()``, each storage once).
- ``activation_bytes``: storage bytes autograd saved for backward (``saved_tensors_hooks`` pack)
  while this module was the innermost one running, each storage once per call, summed over
  the step's calls, parameters excluded. A storage saved by two modules (the same input to q,
  k and v projections) counts in each. The inclusive figure (submodules included, each
  storage once per call) goes out as an ``Event(name="module_activations")``: it is what
  checkpointing the module would drop.
- ``input_bytes`` / ``output_bytes``: storage bytes of the tensors passed positionally to / returned
  by ``forward``, each storage once per call, summed over calls.
- ``calls``: forward calls in the step that ran with gradients enabled (the ones that can save
  for backward); ``live_calls``: the most of those that ran with no backward between them, so
  whose saved tensors can be alive together (1 under gradient accumulation, where each
  micro-batch's backward frees its activations before the next forward; T for a cell unrolled
  T times before one backward). A backward is seen as an op run by an autograd node.
- ``call_activation_bytes`` / ``call_input_bytes`` / ``call_output_bytes``: the largest figure
  of one grad-enabled call (the totals above sum every call of the step).
- ``checkpoint_freed_bytes``: what checkpointing this module alone would free while it waits for
  its backward: storages created inside its forward call and saved there, by nothing after the
  call (its input, created before the call, is kept by the checkpoint and never counts).
  ``checkpoint_freed_late_bytes``: storages created and saved inside the call that something
  after it saves too (a ResNet block's in-place ReLU output, the next block's input): alive
  while the later module waits, gone by this module's backward, where its recomputation
  starts; the call's output too (the code after the call holds it while that runs). Both
  summed over the step's calls; None without the tracker's creation clock.
- ``forward_s``: wall time from the forward pre-hook to the forward hook (``time.perf_counter``),
  submodules included, summed over calls; recomputation during backward is ignored.
- ``backward_s``: wall time of the backward ops run by autograd nodes created inside this module's
  forward, submodules included (nodes are tagged in ``grad_fn.metadata`` after forward; the
  dispatch mode times each op under ``torch._C._current_autograd_node()``). On CUDA this is host
  time spent launching, not kernel time. Gradient accumulation into ``.grad`` is not attributed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from advisor.probes.memory.categories import storage_key, tensors_in
from advisor.probes.module_events import Unsubscribe, subscribe_module_events
from advisor.probes.module_nodes import TAG, input_nodes, node_module, running_module, tag_created_nodes
from advisor.records.samples import ModuleStat

__all__ = ["TAG", "ModuleAttributor"]


@dataclass
class _Acc:
    type: str
    depth: int
    parameter_bytes: int
    input_bytes: int = 0
    output_bytes: int = 0
    forward_s: float = 0.0
    activation_bytes: int = 0
    inclusive_bytes: int = 0
    calls: int = 0
    live_calls: int = 0
    epoch: int = -1  # the backward-free stretch its last call ran in
    epoch_calls: int = 0
    call_activation_bytes: int = 0
    call_input_bytes: int = 0
    call_output_bytes: int = 0
    own_keys: set[int] = field(default_factory=set)
    inclusive_keys: set[int] = field(default_factory=set)


@dataclass
class _Frame:
    """One running forward call on the module stack."""

    name: str | None
    started: float
    stop_nodes: set[Any] = field(default_factory=set)
    own_start: int = 0  # the module's own activation bytes when the call began
    grad: bool = False
    seq0: int = 0  # the tracker's creation clock when the call began
    call: int = 0  # this call's number in the step


def _storages(value: Any, device_type: str) -> dict[int, int]:
    """The storages of the tensors in ``value`` on ``device_type``: key -> bytes, each once."""
    seen: dict[int, int] = {}
    for tensor in tensors_in(value):
        if tensor.device.type != device_type:
            continue
        found = storage_key(tensor)
        if found is not None:
            seen[found[0]] = found[1]
    return seen


def _bytes_of(value: Any, device_type: str) -> int:
    return sum(_storages(value, device_type).values())


def _parameter_bytes(module: torch.nn.Module) -> int:
    seen: dict[int, int] = {}
    for p in module.parameters():
        found = storage_key(p)
        if found is not None:
            seen[found[0]] = found[1]
    return sum(seen.values())


class ModuleAttributor:
    """Keeps the stack of running modules and accumulates their figures for one deep step."""

    def __init__(
        self,
        *,
        name_of: Callable[[torch.nn.Module], str | None],
        in_backward: Callable[[], bool],
        device_type: str = "cpu",
    ) -> None:
        self._name_of = name_of
        self._in_backward = in_backward
        self.device_type = device_type
        self.stack: list[_Frame] = []
        self._epoch = 0  # counts stretches of forward calls separated by a backward
        self._backward_seen = False
        self.acc: dict[str, _Acc] = {}
        self.backward_own: dict[str, float] = {}
        self._unsubscribe: Unsubscribe | None = None
        # Set by the memory probe to the tracker's: the creation clock, and a storage's time on it.
        self.clock: Callable[[], int] | None = None
        self.created_at: Callable[[int], int] | None = None
        self._calls: dict[int, str] = {}  # call number -> module name (numbers run on over the step)
        self._outputs: dict[int, set[int]] = {}  # call number -> its output's storage keys
        self._saves: dict[int, tuple[int, list[frozenset[int]]]] = {}  # key -> (bytes, calls holding its creation, per save)
        self._freed: dict[str, int] = {}
        self._freed_late: dict[str, int] = {}

    def start(self, ctx: Any = None) -> None:
        """Follow module forwards through ``ctx``'s module events (the agent's one hook set),
        or through global hooks of our own when it has none."""
        self._unsubscribe = subscribe_module_events(ctx, self._pre, self._post)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.stack.clear()

    def reset(self) -> None:
        self.acc.clear()
        self.backward_own.clear()
        self.stack.clear()
        self._epoch, self._backward_seen = 0, False
        self._calls.clear()
        self._outputs.clear()
        self._saves.clear()
        self._freed.clear()
        self._freed_late.clear()

    def current(self) -> str | None:
        """Qualified name of the innermost running module with a name, or None.

        In backward the module is the one whose forward created the running autograd node.
        """
        for frame in reversed(self.stack):
            if frame.name is not None:
                return frame.name
        return running_module()

    # -- hooks -----------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._in_backward():  # recomputation under checkpointing: not this step's forward
            return
        name = self._name_of(module)
        frame = _Frame(name=name, started=time.perf_counter())
        if name is not None:
            acc = self.acc.get(name)
            if acc is None:
                depth = 0 if name == "" else name.count(".") + 1
                acc = _Acc(type(module).__name__, depth, _parameter_bytes(module))
                self.acc[name] = acc
            nbytes = _bytes_of(args, self.device_type)
            acc.input_bytes += nbytes
            frame.stop_nodes = input_nodes(args)
            # Storage keys are allocator addresses, reused once a micro-batch's backward frees
            # its activations: a storage is counted once per call, not once per step.
            acc.own_keys.clear()
            acc.inclusive_keys.clear()
            frame.own_start = acc.activation_bytes
            frame.grad = torch.is_grad_enabled()
            if frame.grad:
                self._count_call(acc)
                acc.call_input_bytes = max(acc.call_input_bytes, nbytes)
            if self.clock is not None:
                frame.seq0, frame.call = self.clock(), len(self._calls)
                self._calls[frame.call] = name
        self.stack.append(frame)

    def _count_call(self, acc: _Acc) -> None:
        if self._backward_seen:  # a backward ran since the last forward call: a new stretch
            self._epoch += 1
            self._backward_seen = False
            self._fold_saves()  # storage keys are addresses: the freed ones may come back
        if acc.epoch != self._epoch:
            acc.epoch, acc.epoch_calls = self._epoch, 0
        acc.calls += 1
        acc.epoch_calls += 1
        acc.live_calls = max(acc.live_calls, acc.epoch_calls)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._in_backward() or not self.stack:
            return
        frame = self.stack.pop()
        name = frame.name
        if name is None:
            return
        acc = self.acc[name]
        acc.forward_s += time.perf_counter() - frame.started
        outputs = _storages(output, self.device_type)
        nbytes = sum(outputs.values())
        acc.output_bytes += nbytes
        if frame.grad:
            acc.call_output_bytes = max(acc.call_output_bytes, nbytes)
            acc.call_activation_bytes = max(acc.call_activation_bytes, acc.activation_bytes - frame.own_start)
        tag_created_nodes(output, name, frame.stop_nodes)
        if self.clock is not None and frame.grad:
            self._outputs[frame.call] = set(outputs)

    def on_saved(self, key: int, nbytes: int, is_role: bool) -> None:
        """A storage was saved for backward (called by the tracker's pack hook)."""
        if is_role or self._in_backward():
            return
        innermost = True
        for frame in reversed(self.stack):
            name = frame.name
            if name is None:
                continue
            acc = self.acc[name]
            if innermost and key not in acc.own_keys:
                acc.own_keys.add(key)
                acc.activation_bytes += nbytes
            innermost = False
            if key not in acc.inclusive_keys:
                acc.inclusive_keys.add(key)
                acc.inclusive_bytes += nbytes
        if self.created_at is not None:
            seq = self.created_at(key)
            holding = frozenset(f.call for f in self.stack if f.name is not None and 0 <= f.seq0 <= seq)
            self._saves.setdefault(key, (nbytes, []))[1].append(holding)

    def _fold_saves(self) -> None:
        """Each saved storage into the calls it was created in: freed by their checkpoint when
        every save of it was inside the call, freed late when something after the call saved it
        or it is the call's output (the code after the call holds it while it runs)."""
        for key, (nbytes, saves) in self._saves.items():
            for call in frozenset().union(*saves):
                name = self._calls.get(call)
                if name is None:
                    continue
                late = key in self._outputs.get(call, ()) or not all(call in held for held in saves)
                into = self._freed_late if late else self._freed
                into[name] = into.get(name, 0) + nbytes
        self._saves.clear()
        self._outputs.clear()

    def on_backward_op(self, node: Any, seconds: float) -> None:
        self._backward_seen = True
        tag = node_module(node)
        if tag is not None:
            self.backward_own[tag] = self.backward_own.get(tag, 0.0) + seconds

    # -- results ---------------------------------------------------------------------------
    def _inclusive_backward(self) -> dict[str, float]:
        """Every module's backward seconds with its submodules': each tag's own time added to it
        and to each dotted prefix of it, one pass over the tags (a sum over every tag per module
        was quadratic: 6.7 s at 5001 modules)."""
        out: dict[str, float] = {}
        for tag, seconds in self.backward_own.items():
            out[""] = out.get("", 0.0) + seconds
            name = tag
            while name:
                out[name] = out.get(name, 0.0) + seconds
                name = name.rpartition(".")[0]
        return out

    def stats(self, *, step: int, rank: int) -> list[ModuleStat]:
        self._fold_saves()
        tracked = self.created_at is not None
        backward = self._inclusive_backward()
        return [
            ModuleStat(
                rank=rank,
                step=step,
                name=name,
                type=acc.type,
                depth=acc.depth,
                parameter_bytes=acc.parameter_bytes,
                activation_bytes=acc.activation_bytes,
                input_bytes=acc.input_bytes,
                output_bytes=acc.output_bytes,
                forward_s=acc.forward_s,
                backward_s=backward.get(name, 0.0),
                calls=acc.calls,
                live_calls=acc.live_calls,
                call_activation_bytes=acc.call_activation_bytes,
                call_input_bytes=acc.call_input_bytes,
                call_output_bytes=acc.call_output_bytes,
                checkpoint_freed_bytes=self._freed.get(name, 0) if tracked else None,
                checkpoint_freed_late_bytes=self._freed_late.get(name, 0) if tracked else None,
            )
            for name, acc in self.acc.items()
        ]

    def inclusive_activations(self) -> dict[str, int]:
        return {name: acc.inclusive_bytes for name, acc in self.acc.items()}
