"""The peak of a checkpointed chain, simulated over the measured timeline of an unremedied step.

The conservative model in ``memory_model`` adds every kept byte to the largest recomputed block.
The real backward is kinder: when block i is recomputed, the blocks after it have already released
their activations, the loss head's temporaries are gone, and only the blocks before i still hold
theirs. This model does not re-derive any of that from formulas. It takes the deep step's own
memory timeline (one ``MemorySample`` per op, with the innermost module that ran it: source
``advisor.probes.memory``, bytes) and asks, for every instant, how much less would be live had a
set S of chain blocks been checkpointed:

- during its own forward a checkpointed block frees what its finished ops saved, except what the
  running code still references (the running module's and its ancestors' inputs, the block's input
  and one running residual of that size);
- a checkpointed block j keeps only its input while it waits for backward, so it frees
  ``s_j`` = (activation bytes saved by ops inside block j, measured as the growth of the
  "activation" category over its forward) - (its input, which the checkpoint keeps);
- during the forward of block m the blocks j < m are waiting; during the backward of block i the
  blocks j < i still wait, and i itself is live again: recomputed from its input, it grows from
  (the total when its backward starts, less s_i) by its measured forward growth;
- between the chain's forward and its backward (loss head) every block is waiting; before the
  chain and after it (embedding, optimizer) nothing is.

    peak(S) = max over instants t of  total(t) - sum_{j in S, j waiting at t} s_j
                                      (block i's recomputation at its backward, i in S)
                                      (- block m's own saved growth during its forward, m in S)

It is exact where the checkpoint frees precisely what the block saved and everything else runs as
measured; the CPU storage tracker's peak of a checkpointed run is the check (tests/test_peak_model.py:
equal to the byte on examples/gpt.py's model for every selection tried). Not modelled: tensors
that only a reference cycle keeps alive until the garbage collector runs.
``solve`` chooses S for a budget by dynamic programming over the chain with a Pareto front of
(prefix savings, recompute time), exact because every constraint only improves with more savings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, Sequence

MODEL = "simulated backward over the measured timeline (recommend/peak_model.py)"


class Sample(Protocol):
    """What the model reads of a ``MemorySample`` record."""

    step: int
    event: str
    module: str | None
    total_bytes: int
    categories: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class BlockMemory:
    """One chain block, measured on the unremedied step (bytes)."""

    name: str
    saving_bytes: int  # s_j: freed while the block waits for backward, if checkpointed
    forward_max: int  # highest total during its forward
    forward_max_own: int  # highest total during its forward less what it saved so far (if checkpointed)
    backward_max: int  # highest total during its backward
    recompute_peak: int  # highest total while its forward is recomputed, if checkpointed (before savings of earlier blocks)


@dataclass(frozen=True, kw_only=True)
class ChainMemory:
    """The chain's blocks plus the highest totals outside them (bytes), from one measured step."""

    step: int
    blocks: tuple[BlockMemory, ...]
    outside_bytes: int  # before the chain's forward and after its backward (embedding, optimizer)
    between_bytes: int  # after the chain's forward and before its backward (loss head)
    measured_peak_bytes: int

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.blocks)


def _block_of(module: str | None, names: Sequence[str]) -> int | None:
    if not module:
        return None
    for i, name in enumerate(names):
        if module == name or module.startswith(name + "."):
            return i
    return None


def chain_memory(samples: Iterable[Sample], names: Sequence[str], module_inputs: Mapping[str, int]) -> ChainMemory | None:
    """Summarise the timeline of the step with the highest peak that ran one forward and one
    backward through the chain ``names`` (in forward order). ``module_inputs``: input bytes of
    every measured module by qualified name (``ModuleStat.input_bytes``). None when no such step
    was measured (no deep step, gradient accumulation, several forwards per step, blocks out of
    order)."""
    by_step: dict[int, list[Sample]] = {}
    for s in samples:
        by_step.setdefault(s.step, []).append(s)
    best: ChainMemory | None = None
    for step, seq in by_step.items():
        summary = _summarise(step, seq, names, module_inputs)
        if summary is not None and (best is None or summary.measured_peak_bytes > best.measured_peak_bytes):
            best = summary
    return best


def _summarise(step: int, seq: Sequence[Sample], names: Sequence[str], module_inputs: Mapping[str, int]) -> ChainMemory | None:
    n = len(names)
    phase = "data"
    fwd: list[list[Sample]] = [[] for _ in range(n)]
    bwd: list[list[Sample]] = [[] for _ in range(n)]
    outside = between = 0
    last_fwd = last_bwd = None  # the chain index reached so far in each direction
    before_block: list[Sample | None] = [None] * n  # the last sample before each block's forward
    before_bwd: list[Sample | None] = [None] * n  # the last sample before each block's backward
    prev: Sample | None = None
    passes = 0
    for s in seq:
        if s.event == "forward_start":
            passes += 1
            phase = "forward"
        elif s.event == "backward_start":
            phase = "backward"
        elif s.event in ("optimizer_start", "step_end", "optimizer_end"):
            phase = "optimizer"
        i = _block_of(s.module, names)
        if phase == "forward" and i is not None:
            if last_fwd is not None and i < last_fwd:
                return None  # the chain ran twice, or out of order
            if not fwd[i]:
                before_block[i] = prev
            last_fwd = i
            fwd[i].append(s)
        elif phase == "backward" and i is not None:
            if last_bwd is not None and i > last_bwd:
                return None
            if not bwd[i]:
                before_bwd[i] = prev
            last_bwd = i
            bwd[i].append(s)
        elif phase == "forward" and last_fwd is not None and last_fwd == n - 1:
            between = max(between, s.total_bytes)  # head and loss, after the chain's forward
        elif phase == "backward" and last_bwd is None:
            between = max(between, s.total_bytes)  # head's backward, before the chain's
        else:
            outside = max(outside, s.total_bytes)
        prev = s
    if passes != 1 or any(not f for f in fwd) or any(not b for b in bwd):
        return None
    blocks = []
    for i in range(n):
        start = before_block[i] or fwd[i][0]
        act0 = start.categories.get("activation", 0)
        grown = fwd[i][-1].categories.get("activation", 0) - act0
        x = int(module_inputs.get(names[i], 0))
        saving = max(0, grown - x)
        own = [s.total_bytes - max(0, s.categories.get("activation", 0) - act0 - _referenced(s.module, names[i], x, module_inputs))
               for s in fwd[i]]
        # Recomputed at the start of its backward, the block grows again from its input alone, as
        # it grew in the forward: from (the total then, less what it saved) by its forward growth.
        growth = max(s.total_bytes - start.total_bytes for s in fwd[i])
        at_backward = (before_bwd[i] or bwd[i][0]).total_bytes
        blocks.append(BlockMemory(
            name=names[i], saving_bytes=saving,
            forward_max=max(s.total_bytes for s in fwd[i]), forward_max_own=max(own),
            backward_max=max(s.total_bytes for s in bwd[i]),
            recompute_peak=at_backward - saving + growth))
    peak = max([outside, between] + [b.forward_max for b in blocks] + [b.backward_max for b in blocks])
    return ChainMemory(step=step, blocks=tuple(blocks), outside_bytes=outside, between_bytes=between,
                       measured_peak_bytes=peak)


def _referenced(module: str | None, block: str, x: int, module_inputs: Mapping[str, int]) -> int:
    """Saved bytes a checkpointed block's forward still holds through the running code at an op in
    ``module``: the block's input (the checkpoint keeps it), the inputs of the running module and of
    its ancestors inside the block, and one running residual the size of the block's input."""
    held = 2 * x
    name = module or ""
    while name and name != block and name.startswith(block + "."):
        held += int(module_inputs.get(name, 0))
        name = name.rpartition(".")[0]
    return held


def _mask(n: int, selected: Iterable[int] | Sequence[bool]) -> list[bool]:
    items = list(selected)
    if items and all(isinstance(v, bool) for v in items):
        if len(items) != n:
            raise ValueError(f"selection mask has {len(items)} entries; valid: {n} (one per block)")
        return items
    chosen = {int(v) for v in items}
    bad = sorted(i for i in chosen if not 0 <= i < n)
    if bad:
        raise ValueError(f"block indices {bad} out of range; valid: 0..{n - 1}")
    return [i in chosen for i in range(n)]


def _block_peak(block: BlockMemory, prefix: int, on: bool) -> int:
    """The highest total during this block's forward and backward, given the savings of the
    checkpointed blocks before it (``prefix``) and whether it is checkpointed itself."""
    forward = (block.forward_max_own if on else block.forward_max) - prefix
    backward = max(block.backward_max, block.recompute_peak if on else 0) - prefix
    return max(forward, backward)


def simulated_peak(memory: ChainMemory, selected: Iterable[int] | Sequence[bool]) -> int:
    """Predicted peak bytes with the selected blocks checkpointed (indices or a boolean mask)."""
    mask = _mask(len(memory.blocks), selected)
    prefix = 0
    peak = memory.outside_bytes
    for block, on in zip(memory.blocks, mask):
        peak = max(peak, _block_peak(block, prefix, on))
        if on:
            prefix += block.saving_bytes
    return max(peak, memory.between_bytes - prefix)


@dataclass(frozen=True, kw_only=True)
class Choice:
    selected: tuple[int, ...]
    peak_bytes: int
    recompute_s: float


def solve(memory: ChainMemory, forward_s: Sequence[float], budget_bytes: int, *, front_limit: int = 4096) -> Choice | None:
    """The set of blocks to checkpoint with the least recompute time whose simulated peak fits
    ``budget_bytes``; None when no set fits. Exact while the Pareto front stays under
    ``front_limit`` entries; beyond it the front keeps an evenly spread subset (still feasible
    plans, perhaps not the cheapest)."""
    if len(forward_s) != len(memory.blocks):
        raise ValueError(f"{len(forward_s)} forward times for {len(memory.blocks)} blocks")
    if memory.outside_bytes > budget_bytes:
        return None
    # front: prefix savings -> (recompute seconds, chosen indices), Pareto-optimal
    front: list[tuple[int, float, tuple[int, ...]]] = [(0, 0.0, ())]
    for i, block in enumerate(memory.blocks):
        grown: list[tuple[int, float, tuple[int, ...]]] = []
        for prefix, cost, chosen in front:
            for on in (False, True):
                if _block_peak(block, prefix, on) > budget_bytes:
                    continue
                if on:
                    grown.append((prefix + block.saving_bytes, cost + forward_s[i], chosen + (i,)))
                else:
                    grown.append((prefix, cost, chosen))
        front = _pareto(grown, front_limit)
        if not front:
            return None
    feasible = [(cost, -prefix, chosen) for prefix, cost, chosen in front
                if memory.between_bytes - prefix <= budget_bytes]
    if not feasible:
        return None
    cost, _, chosen = min(feasible)
    return Choice(selected=chosen, peak_bytes=simulated_peak(memory, chosen), recompute_s=cost)


def _pareto(items: list[tuple[int, float, tuple[int, ...]]], limit: int) -> list[tuple[int, float, tuple[int, ...]]]:
    """Keep entries no other entry beats on both savings (more) and time (less)."""
    items.sort(key=lambda e: (-e[0], e[1]))
    out: list[tuple[int, float, tuple[int, ...]]] = []
    best_cost = float("inf")
    for entry in items:
        if entry[1] < best_cost:
            out.append(entry)
            best_cost = entry[1]
    if len(out) > limit:
        stride = len(out) / limit
        out = [out[int(k * stride)] for k in range(limit)]
    return out
