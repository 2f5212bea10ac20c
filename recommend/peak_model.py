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
  ``s_j`` = the storages created and saved inside its forward that nothing after it saves and
  that are not its output (the memory probe follows each saved storage:
  ``ModuleStat.checkpoint_freed_bytes``). Sessions without that figure use the growth of the
  "activation" category over its forward less its input (which the checkpoint keeps);
- what block j created and saved that something after it saves too (a ResNet block's in-place
  ReLU output, saved again by the next block), ``l_j`` (``checkpoint_freed_late_bytes``), is
  alive while j waits and gone by j's backward, after the later saver's backward ran;
- during the forward of block m the blocks j < m are waiting; during the backward of block i the
  blocks j < i still wait, and i itself is live again: recomputed from its input, it grows from
  (the total just before its first backward op, less s_i and l_i) by its measured forward growth
  (from the total just before its first forward op; ``MemorySample.op_bytes`` gives both);
- between the chain's forward and its backward (loss head) every block is waiting; before the
  chain and after it (embedding, optimizer) nothing is.

    peak(S) = max over instants t of  total(t) - sum_{j in S, j waiting at t} s_j
                                      (block i's recomputation at its backward, i in S)
                                      (- block m's own saved growth during its forward, m in S)

Offloaded blocks (``apply/remedies/activation_offload.py``) extend the same sums. An offloaded
block runs its forward as measured (the applier holds each saved source until the call ends), then
frees *all* it saved, its input included: ``o_j`` = the growth of "activation" over its forward.
Its backward fetches its tensors back at their first use (as they were live in the measured run)
and, when the block just before it is offloaded too, prefetches that block's ``o_{j-1}``, which
stays on the device through this block's backward:

    during the backward of offloaded block i:  total(t) - savings(j < i) + [i-1 offloaded] o_{i-1}

It is exact where the checkpoint frees precisely what the block saved and everything else runs as
measured; the CPU storage tracker's peak of a checkpointed run is the check (tests/test_peak_model.py:
equal to the byte on examples/gpt.py's model and on examples/cnn.py's ResNet, by stages and by
BasicBlocks, for every selection tried). Not modelled: tensors
that only a reference cycle keeps alive until the garbage collector runs.
``solve`` chooses S for a budget by dynamic programming over the chain with a Pareto front of
(prefix savings, recompute time), exact because every constraint only improves with more savings;
``solve_choices`` is the same program over keep / recompute / offload with any per-choice cost
(the previous block's choice is the state: the prefetch and the copies' overlap depend on it).
Not modelled for offload: tensors below the applier's ``min_bytes`` stay on the device (the
measured growth counts them as offloaded), and a block whose output the block itself saves keeps
it alive through the next block's forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

MODEL = "simulated backward over the measured timeline (recommend/peak_model.py)"
KEEP, RECOMPUTE, OFFLOAD = "keep", "recompute", "offload"
CHOICES = (KEEP, RECOMPUTE, OFFLOAD)


class Sample(Protocol):
    """What the model reads of a ``MemorySample`` record."""

    step: int
    event: str
    module: str | None
    total_bytes: int
    categories: dict[str, int]
    op_bytes: int | None


@dataclass(frozen=True, kw_only=True)
class BlockMemory:
    """One chain block, measured on the unremedied step (bytes)."""

    name: str
    saving_bytes: int  # s_j: freed while the block waits for backward, if checkpointed
    forward_max: int  # highest total during its forward
    forward_max_own: int  # highest total during its forward less what it saved so far (if checkpointed)
    backward_max: int  # highest total during its backward
    recompute_peak: int  # highest total while its forward is recomputed, if checkpointed (before savings of earlier blocks)
    offload_bytes: int = 0  # o_j: all it saved (its input too), freed until its backward if offloaded


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


def module_figures(modules: Iterable[Any]) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """``chain_memory``'s ``module_inputs`` and ``freed`` from module records (``ModuleStat`` or
    ``ModuleProfile``: ``name``, ``input_bytes``, ``checkpoint_freed_bytes``,
    ``checkpoint_freed_late_bytes``); a module without the freed figures is left out of ``freed``."""
    modules = list(modules)
    inputs = {m.name: m.input_bytes for m in modules}
    freed = {m.name: (m.checkpoint_freed_bytes, m.checkpoint_freed_late_bytes or 0) for m in modules
             if m.checkpoint_freed_bytes is not None}
    return inputs, freed


def chain_memory(samples: Iterable[Sample], names: Sequence[str], module_inputs: Mapping[str, int],
                 freed: Mapping[str, tuple[int, int]] | None = None) -> ChainMemory | None:
    """Summarise the timeline of the step with the highest peak that ran one forward and one
    backward through the chain ``names`` (in forward order). ``module_inputs``: input bytes of
    every measured module by qualified name (``ModuleStat.input_bytes``); ``freed``: what
    checkpointing each frees while it waits and what only by its own backward
    (``ModuleStat.checkpoint_freed_bytes``, ``checkpoint_freed_late_bytes``), where measured.
    None when no such step was measured (no deep step, gradient accumulation, several forwards
    per step, blocks out of order)."""
    by_step: dict[int, list[Sample]] = {}
    for s in samples:
        by_step.setdefault(s.step, []).append(s)
    best: ChainMemory | None = None
    for step, seq in by_step.items():
        summary = _summarise(step, seq, names, module_inputs, freed or {})
        if summary is not None and (best is None or summary.measured_peak_bytes > best.measured_peak_bytes):
            best = summary
    return best


def _summarise(step: int, seq: Sequence[Sample], names: Sequence[str], module_inputs: Mapping[str, int],
               freed: Mapping[str, tuple[int, int]]) -> ChainMemory | None:
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
        # What the checkpoint frees: per storage where the probe measured it (what the block
        # created and saved, less what something after it saves too: that goes only once the
        # later module's backward ran, before this block's recomputation); else the growth of
        # saved bytes over its forward less its input, which the checkpoint keeps.
        saving, late = freed.get(names[i], (max(0, grown - x), 0))
        own = [s.total_bytes - max(0, s.categories.get("activation", 0) - act0 - _referenced(s.module, names[i], x, module_inputs))
               for s in fwd[i]]
        # Recomputed at the start of its backward, the block grows again from its input alone, as
        # it grew in the forward: from (the total then, less what it saved) by its forward growth.
        # From the total just before its first op: the sample before the block can still hold
        # the previous block's temporaries (freed before this one's first op).
        start_total = _before_op(start, fwd[i][0])
        growth = max(s.total_bytes for s in fwd[i]) - start_total
        # The total as the block's backward begins: at most the sample before it (only frees
        # happen between the two: a gradient sum's inputs, for one) and at most the sample after
        # its first op less that op's new storages (``op_bytes``; older records: the whole sample).
        at_backward = _before_op(before_bwd[i] or bwd[i][0], bwd[i][0])
        blocks.append(BlockMemory(
            name=names[i], saving_bytes=saving,
            forward_max=max(s.total_bytes for s in fwd[i]), forward_max_own=max(own),
            backward_max=max(s.total_bytes for s in bwd[i]),
            recompute_peak=at_backward - saving - late + growth, offload_bytes=max(0, grown)))
    peak = max([outside, between] + [b.forward_max for b in blocks] + [b.backward_max for b in blocks])
    return ChainMemory(step=step, blocks=tuple(blocks), outside_bytes=outside, between_bytes=between,
                       measured_peak_bytes=peak)


def _before_op(before: Sample, first: Sample) -> int:
    """The total just before ``first``'s op ran: at most the sample before it (only frees happen
    between the two) and at most ``first`` less its op's new storages (``op_bytes``; records
    without it: the whole of ``first``, an upper bound)."""
    return min(before.total_bytes, first.total_bytes - (first.op_bytes or 0))


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


def saving_of(block: BlockMemory, choice: str) -> int:
    """Bytes the block frees while it waits for backward under ``choice``."""
    return block.saving_bytes if choice == RECOMPUTE else block.offload_bytes if choice == OFFLOAD else 0


def block_peak(block: BlockMemory, prefix: int, choice: str, prefetched: int = 0) -> int:
    """The highest total during this block's forward and backward, given the savings of the
    blocks before it (``prefix``), its own choice, and the bytes of the block before it that its
    backward prefetches (offloaded after offloaded)."""
    if choice == RECOMPUTE:
        return max(block.forward_max_own, block.backward_max, block.recompute_peak) - prefix
    return max(block.forward_max, block.backward_max + (prefetched if choice == OFFLOAD else 0)) - prefix


def choices_peak(memory: ChainMemory, choices: Sequence[str]) -> int:
    """Predicted peak bytes with each block kept, recomputed or offloaded (one choice per block)."""
    if len(choices) != len(memory.blocks) or any(c not in CHOICES for c in choices):
        raise ValueError(f"choices must be {len(memory.blocks)} of {CHOICES}, got {list(choices)!r}")
    prefix = 0
    peak = memory.outside_bytes
    prev: BlockMemory | None = None
    for i, (block, c) in enumerate(zip(memory.blocks, choices)):
        fetched = prev.offload_bytes if prev is not None and choices[i - 1] == OFFLOAD else 0
        peak = max(peak, block_peak(block, prefix, c, fetched))
        prefix += saving_of(block, c)
        prev = block
    return max(peak, memory.between_bytes - prefix)


def simulated_peak(memory: ChainMemory, selected: Iterable[int] | Sequence[bool],
                   offloaded: Iterable[int] = ()) -> int:
    """Predicted peak bytes with the selected blocks checkpointed (indices or a boolean mask) and
    the ``offloaded`` ones (indices) offloaded."""
    n = len(memory.blocks)
    out = [RECOMPUTE if on else KEEP for on in _mask(n, selected)]
    for i in set(offloaded):
        if not 0 <= i < n:
            raise ValueError(f"offloaded block index {i} out of range; valid: 0..{n - 1}")
        if out[i] == RECOMPUTE:
            raise ValueError(f"block {i} is both checkpointed and offloaded")
        out[i] = OFFLOAD
    return choices_peak(memory, out)


@dataclass(frozen=True, kw_only=True)
class Choice:
    selected: tuple[int, ...]
    peak_bytes: int
    recompute_s: float


@dataclass(frozen=True, kw_only=True)
class JointChoice:
    choices: tuple[str, ...]
    peak_bytes: int
    cost_s: float
    exact: bool = True  # False when a front was thinned (still a valid plan, perhaps not the best)


# A cost callback: seconds added when block i takes ``choice`` after block i-1 took ``previous``
# (None before the first block); called once more with i = n and choice None to close the chain.
Cost = Callable[[int, "str | None", "str | None"], float]
_Label = tuple[int, float, tuple[str, ...]]  # (prefix savings, score, choices so far)


def _front_dp(memory: ChainMemory, allowed: Sequence[str], score: Callable[[float, int, str | None, str, int], float | None],
              front_limit: int) -> tuple[dict[str | None, list[_Label]], bool]:
    """The dynamic program shared by ``solve_choices`` and ``lowest_choices``: per previous
    choice, the Pareto front of (more savings, lower score) labels over the whole chain.
    ``score(old, i, previous, choice, block peak)`` is the new score, or None when infeasible.
    Also says whether any front was thinned to ``front_limit``."""
    n = len(memory.blocks)
    states: dict[str | None, list[_Label]] = {None: [(0, 0.0, ())]}
    thinned = False
    for i, block in enumerate(memory.blocks):
        prev_o = memory.blocks[i - 1].offload_bytes if i else 0
        grown: dict[str | None, list[_Label]] = {}
        for prev, labels in states.items():
            for c in allowed:
                if c == OFFLOAD and i == n - 1:
                    continue  # the last block before the loss is never offloaded
                fetched = prev_o if prev == OFFLOAD else 0
                add = saving_of(block, c)
                for prefix, old, path in labels:
                    new = score(old, i, prev, c, block_peak(block, prefix, c, fetched))
                    if new is not None:
                        grown.setdefault(c, []).append((prefix + add, new, path + (c,)))
        states = {c: _pareto(labels, front_limit) for c, labels in grown.items()}
        thinned |= any(len(labels) == front_limit for labels in states.values())
        if not states:
            break
    return states, thinned


def solve_choices(memory: ChainMemory, budget_bytes: int, cost: Cost, *, allowed: Sequence[str] = CHOICES,
                  front_limit: int = 4096) -> JointChoice | None:
    """The choices with the least total ``cost`` whose simulated peak fits ``budget_bytes``; None
    when none fits. Exact while each front stays under ``front_limit`` entries."""
    allowed = tuple(c for c in CHOICES if c in set(allowed) | {KEEP})
    if memory.outside_bytes > budget_bytes:
        return None

    def score(old: float, i: int, prev: str | None, c: str, peak: int) -> float | None:
        return None if peak > budget_bytes else old + cost(i, prev, c)

    best: tuple[float, int, tuple[str, ...]] | None = None
    states, thinned = _front_dp(memory, allowed, score, front_limit)
    for last, labels in states.items():
        close = cost(len(memory.blocks), last, None)
        for prefix, spent, path in labels:
            if len(path) == len(memory.blocks) and memory.between_bytes - prefix <= budget_bytes:
                if best is None or (spent + close, -prefix) < best[:2]:
                    best = (spent + close, -prefix, path)
    if best is None:
        return None
    return JointChoice(choices=best[2], peak_bytes=choices_peak(memory, best[2]), cost_s=best[0], exact=not thinned)


def lowest_choices(memory: ChainMemory, *, allowed: Sequence[str] = CHOICES, front_limit: int = 4096) -> JointChoice:
    """The choices with the lowest simulated peak (``cost_s`` 0: time is not considered)."""
    allowed = tuple(c for c in CHOICES if c in set(allowed) | {KEEP})

    def score(old: float, i: int, prev: str | None, c: str, peak: int) -> float:
        return max(old, float(peak))

    best: tuple[int, tuple[str, ...]] | None = None
    states, thinned = _front_dp(memory, allowed, score, front_limit)
    for labels in states.values():
        for prefix, running, path in labels:
            peak = max(int(running), memory.between_bytes - prefix, memory.outside_bytes)
            if best is None or peak < best[0]:
                best = (peak, path)
    assert best is not None  # keeping every block is always a path
    return JointChoice(choices=best[1], peak_bytes=choices_peak(memory, best[1]), cost_s=0.0, exact=not thinned)


def solve(memory: ChainMemory, forward_s: Sequence[float], budget_bytes: int, *, front_limit: int = 4096) -> Choice | None:
    """The set of blocks to checkpoint with the least recompute time whose simulated peak fits
    ``budget_bytes``; None when no set fits. Exact while the Pareto front stays under
    ``front_limit`` entries; beyond it the front keeps an evenly spread subset (still feasible
    plans, perhaps not the cheapest)."""
    if len(forward_s) != len(memory.blocks):
        raise ValueError(f"{len(forward_s)} forward times for {len(memory.blocks)} blocks")
    found = solve_choices(memory, budget_bytes, lambda i, prev, c: forward_s[i] if c == RECOMPUTE else 0.0,
                          allowed=(KEEP, RECOMPUTE), front_limit=front_limit)
    if found is None:
        return None
    chosen = tuple(i for i, c in enumerate(found.choices) if c == RECOMPUTE)
    return Choice(selected=chosen, peak_bytes=found.peak_bytes, recompute_s=found.cost_s)


def _pareto(items: list[_Label], limit: int) -> list[_Label]:
    """Keep entries no other entry beats on both savings (more) and score (less)."""
    items.sort(key=lambda e: (-e[0], e[1]))
    out: list[_Label] = []
    best_cost = float("inf")
    for entry in items:
        if entry[1] < best_cost:
            out.append(entry)
            best_cost = entry[1]
    if len(out) > limit:
        stride = len(out) / limit
        out = [out[int(k * stride)] for k in range(limit)]
    return out
