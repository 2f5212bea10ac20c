"""Predicted peak memory and recompute time when a set of modules is checkpointed.

The model (REFERENCE.md, "Peak during training"): the peak is reached at the
start of backward, when everything kept for backward is live, plus the working
memory of the layer being differentiated. For a list of candidate units
(blocks of a chain, or any non-overlapping modules) and a selection S:

    peak(S) = fixed + other + kept(S) + max_{i in S} a_i        (max over {} = 0)

    kept(S) = sum_{i not in S} a_i
            + sum_{i in S} x_i                                   (a checkpoint keeps its input)
            + sum_{i in S, next(i) not in S} y_i                 (and the output leaving a run)

- a_i: activation bytes produced inside unit i and its descendants (probes
  attribute saved tensors to the innermost producing module) that are alive
  together: one forward call's worth (the step's total over the unit's calls)
  times the calls live at once (``live_calls``). Under gradient accumulation
  each micro-batch's backward frees its activations before the next forward,
  so one call's worth is live, not the step's sum (issue 21, item 2); a cell
  unrolled T times before one backward keeps T calls' worth. Sessions that
  predate per-call figures read the step's total as one call.
- x_i, y_i: the unit's input and output bytes, the largest of one call, times
  the live calls. In a contiguous chain y_i is x_{i+1}, so a run of
  checkpointed blocks [l..r] keeps x_l..x_r and y_r, each boundary once. For units that are not a chain, next(i) is "none", so both
  x_i and y_i are counted.
- Conservative on purpose: x_l may already be inside a_{l-1} (the previous
  block produced it and the next one saved it), and y_r may be inside a_{r+1}
  under another attribution; counting them again can only over-predict.
- max a_i: in backward, a checkpointed unit recomputes its forward and its
  activations live together with all that is still kept. Counting all kept
  bytes (not only those of earlier units) is exact for the last unit and an
  over-estimate for earlier ones.

Calibration from the measured step (``chain_from_profile``):
    fixed = measured peak - activation bytes at the peak   (model states, temporaries, inputs, other)
    other = max(0, activation at peak - sum of candidate a_i)   (embedding, head, loss: not candidates)
so peak({}) = max(measured peak, fixed + sum a_i): never below what was measured.
Recompute time: sum_{i in S} recompute_s_i: what a checkpoint of each block adds, measured on a
copy of one block of its type between steps where the agent tried one (``recompute_seconds``),
else what PyTorch's checkpoint runs again of it, timed on light steps where the agent sampled it (from the call's start to its last saved tensor:
the recomputation stops there), else the block's light-step forward, else the deep step's time
scaled to an ordinary step (``recompute_seconds``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from advisor.recommend.peak_model import ChainMemory, chain_memory, module_figures
from advisor.recommend.profile import ModuleProfile, Profile

COST_MODEL = "peak = fixed + kept(S) + max recomputed block; time += sum recompute_s"


@dataclass(frozen=True, kw_only=True)
class Block:
    """One candidate unit for checkpointing (bytes; seconds of an ordinary step). ``forward_s``:
    its forward; ``recompute_s``: what a checkpoint of it runs again (the forward up to its last
    saved tensor; the forward when unknown)."""

    name: str
    activation_bytes: int
    input_bytes: int
    output_bytes: int
    forward_s: float
    recompute_s: float | None = None

    def __post_init__(self) -> None:
        if self.recompute_s is None:
            object.__setattr__(self, "recompute_s", self.forward_s)

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "activation_bytes": self.activation_bytes,
            "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes,
            "forward_s": self.forward_s,
            "recompute_s": self.recompute_s,
        }


@dataclass(frozen=True, kw_only=True)
class Chain:
    """Candidate units plus the calibrated memory that is not theirs.

    ``contiguous``: unit i's output is unit i+1's input (a ModuleList/Sequential run in order).
    ``baseline_step_time_s``: measured step time without the remedy (None if unknown).
    """

    blocks: tuple[Block, ...]
    fixed_bytes: int = 0
    other_activation_bytes: int = 0
    contiguous: bool = True
    baseline_step_time_s: float | None = None

    @property
    def n(self) -> int:
        return len(self.blocks)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.blocks)

    @property
    def base_bytes(self) -> int:
        """Everything that checkpointing these units cannot change."""
        return self.fixed_bytes + self.other_activation_bytes

    @property
    def baseline_peak_bytes(self) -> int:
        return self.base_bytes + sum(b.activation_bytes for b in self.blocks)

    def to_dict(self) -> dict[str, object]:
        return {
            "blocks": [b.to_dict() for b in self.blocks],
            "fixed_bytes": self.fixed_bytes,
            "other_activation_bytes": self.other_activation_bytes,
            "contiguous": self.contiguous,
            "baseline_step_time_s": self.baseline_step_time_s,
        }


def _mask(chain: Chain, selected: Sequence[bool] | Sequence[int] | set[int]) -> list[bool]:
    """Accept a boolean mask of length n or a collection of block indices."""
    if isinstance(selected, (set, frozenset)) or (selected and not isinstance(next(iter(selected)), bool)):
        idx = set(int(i) for i in selected)
        bad = [i for i in idx if not 0 <= i < chain.n]
        if bad:
            raise ValueError(f"block indices {sorted(bad)} out of range; valid: 0..{chain.n - 1}")
        return [i in idx for i in range(chain.n)]
    mask = [bool(s) for s in selected]
    if mask and len(mask) != chain.n:
        raise ValueError(f"selection mask has {len(mask)} entries; valid: {chain.n} (one per block)")
    return mask or [False] * chain.n


def kept_bytes(chain: Chain, selected: Sequence[bool] | Sequence[int] | set[int]) -> int:
    """Bytes the candidate units keep for backward under the selection (see module docstring)."""
    mask = _mask(chain, selected)
    total = 0
    for i, (block, on) in enumerate(zip(chain.blocks, mask)):
        if not on:
            total += block.activation_bytes
            continue
        total += block.input_bytes
        next_on = chain.contiguous and i + 1 < chain.n and mask[i + 1]
        if not next_on:
            total += block.output_bytes
    return total


def predicted_peak(chain: Chain, selected: Sequence[bool] | Sequence[int] | set[int]) -> int:
    """Predicted peak bytes with the selected units checkpointed."""
    mask = _mask(chain, selected)
    recompute = max((b.activation_bytes for b, on in zip(chain.blocks, mask) if on), default=0)
    return chain.base_bytes + kept_bytes(chain, mask) + recompute


def recompute_s(chain: Chain, selected: Sequence[bool] | Sequence[int] | set[int]) -> float:
    """Extra seconds per step: one more forward of each checkpointed unit."""
    mask = _mask(chain, selected)
    return sum(b.recompute_s for b, on in zip(chain.blocks, mask) if on)


def measured_peak(profile: Profile) -> int:
    """The peak to calibrate against; after an OOM, at least what the failed step asked for."""
    fixed, activation = _calibration(profile)
    return max(profile.peak_bytes, fixed + activation)


def _calibration(profile: Profile) -> tuple[int, int]:
    """(bytes that are not activations at the peak, activation bytes at the peak).

    After an OOM the failed step never reached its peak: its activations are
    at least what was live plus the failed request, and at least every
    module's measured activations alive together (from an earlier deep step,
    if any: one micro-batch's worth under accumulation).
    """
    measured = "activation" in profile.categories_at_peak or "activation" in profile.categories_max
    # Without measured categories, the modules' activations alive together (not their step sum).
    activation = profile.activation_at_peak if measured else live_activation_total(profile)
    fixed = max(0, profile.peak_bytes - activation) if profile.peak_bytes else 0
    oom = profile.oom
    if oom is not None:
        cats = dict(oom.categories)
        at_failure = cats.get("activation", 0)
        fixed = max(fixed, sum(cats.values()) - at_failure)
        activation = max(activation, at_failure + (oom.requested_bytes or 0), live_activation_total(profile))
    return fixed, activation


def find_chain(profile: Profile) -> list[ModuleProfile]:
    """The sibling run of numbered modules ("blocks.0".."blocks.N") holding the most activation bytes.

    Requires at least two members; returns [] when the model has no such run.
    """
    groups: dict[str, list[ModuleProfile]] = {}
    for module in profile.modules:
        head, _, last = module.name.rpartition(".")
        if last.isdigit():
            groups.setdefault(head, []).append(module)
    best: list[ModuleProfile] = []
    best_bytes = -1
    for members in groups.values():
        if len(members) < 2:
            continue
        total = sum(profile.subtree_activation(m.name) for m in members)
        if total > best_bytes:
            best, best_bytes = members, total
    return sorted(best, key=lambda m: int(m.name.rpartition(".")[2]))


def live_calls(module: ModuleProfile) -> tuple[int, int]:
    """(forward calls in the step, calls whose activations are alive together); (1, 1) when
    the session predates per-call figures."""
    if module.calls <= 0:
        return 1, 1
    return module.calls, max(1, min(module.live_calls or module.calls, module.calls))


def live_block(profile: Profile, module: ModuleProfile) -> Block:
    """One module as a checkpointing unit: the bytes it keeps alive together at the peak, and
    the forward seconds of every call in an ordinary step (each call is recomputed once)."""
    calls, live = live_calls(module)
    per_call = module.calls > 0
    return Block(
        name=module.name,
        activation_bytes=profile.subtree_activation(module.name) * live // calls,
        input_bytes=live * module.call_input_bytes if per_call else module.input_bytes,
        output_bytes=live * module.call_output_bytes if per_call else module.output_bytes,
        forward_s=forward_seconds(profile, module),
        recompute_s=recompute_seconds(profile, module),
    )


def forward_seconds(profile: Profile, module: ModuleProfile) -> float:
    """Seconds of ``module``'s forward in an ordinary step: timed on light steps when the agent
    sampled it, else its deep-step time scaled by the light/deep forward ratio (deep steps run
    their probes: slower, and not evenly per module)."""
    light = profile.light_forward_s.get(module.name)
    if light is not None:
        return light
    return module.forward_s * profile.time_scale


def recompute_seconds(profile: Profile, module: ModuleProfile) -> float:
    """Seconds a checkpoint of ``module`` adds to an ordinary step: where a module of its type was
    checkpointed on a copy between steps (``Profile.checkpoint_ratio``), that trial's added time
    over its plain forward times this module's own forward (``forward_seconds``): the recompute
    and the checkpoint's own machinery, which on a small block costs as much again (the zoo's
    GPT-2 block: 3x its forward where one forward was priced). Else the light steps' span from its
    call's start to its last saved tensor (PyTorch's checkpoint stops recomputing there: a GPT
    block's last matmul is not run again), else its whole forward."""
    added = profile.checkpoint_added.get(module.type) if module.type else None
    tried = profile.module(added[0]) if added is not None else None
    if added is not None and tried is not None and forward_seconds(profile, tried) > 0:
        # The trial's seconds, in proportion to this module's forward over the one tried: a
        # timed step's forward holds the timer's hooks (hf_clm's GPT-2 block 1.2 ms there, 0.77
        # in the trial), a share both have, so the proportion is clean where the forward is not.
        return added[1] * forward_seconds(profile, module) / forward_seconds(profile, tried)
    ratio = profile.checkpoint_ratio.get(module.type) if module.type else None
    if ratio is not None:
        return ratio * forward_seconds(profile, module)
    span = profile.light_recompute_s.get(module.name)
    if span is not None:
        return span
    return forward_seconds(profile, module)


def added_step_time(profile: Profile, compute_s: float) -> float:
    """What ``compute_s`` more of the training thread's work adds to an ordinary step: all of it,
    less the data wait it can fill when a loader's workers produce the batches meanwhile (the
    median ``data_s`` of ordinary steps). minGPT's adder with two workers waited 1.6-4 ms a step
    for data; checkpointing added 3.6 ms of backward and the step grew 0.5 ms, the wait having
    shrunk by the rest: priced in full it was predicted 2.3 ms slower than it ran. A loader in the
    main process (no workers) does its work in that wait: nothing to fill."""
    workers = any(loader.num_workers > 0 for loader in profile.loaders)
    slack = (profile.phases.get("data_s") or 0.0) if workers else 0.0
    return max(0.0, compute_s - slack)


def live_activation_total(profile: Profile) -> int:
    """Module activation bytes alive together: each module's own bytes per call times its live
    calls (the step's sum for sessions that predate per-call figures)."""
    total = 0
    for m in profile.modules:
        calls, live = live_calls(m)
        total += m.activation_bytes * live // calls
    return total


def accumulates(profile: Profile) -> bool:
    """Whether the step already runs several forward-backward passes (gradient accumulation, a
    closure evaluated several times): a module called more than once in the step whose calls
    were never all alive together (a backward ran between them)."""
    return any(m.calls > 1 and 0 < m.live_calls < m.calls for m in profile.modules)


def units_from_modules(profile: Profile, modules: Sequence[ModuleProfile], *, contiguous: bool | None = None) -> Chain:
    """Calibrate a ``Chain`` over the given non-overlapping modules (see module docstring)."""
    blocks = tuple(live_block(profile, m) for m in modules)
    if contiguous is None:
        # Consecutive numbered siblings feed each other when each output has the next input's size.
        contiguous = len(blocks) > 1 and all(
            a.output_bytes == b.input_bytes for a, b in zip(blocks, blocks[1:])
        )
    fixed, activation = _calibration(profile)
    candidates = sum(b.activation_bytes for b in blocks)
    return Chain(
        blocks=blocks,
        fixed_bytes=fixed,
        other_activation_bytes=max(0, activation - candidates),
        contiguous=contiguous,
        baseline_step_time_s=profile.step_time_s,
    )


def chain_from_profile(profile: Profile) -> Chain | None:
    """The calibrated chain of the model's repeated blocks, or None when it has none."""
    members = find_chain(profile)
    return units_from_modules(profile, members) if members else None


def chain_timeline(profile: Profile, chain: Chain | None) -> ChainMemory | None:
    """The chain's measured timeline (``peak_model``), when a deep step ran it once forward and
    once backward; None otherwise (no deep step, accumulation, an OOM before backward)."""
    if chain is None or not chain.contiguous or not profile.memory_timeline:
        return None
    return chain_memory(profile.memory_timeline, chain.names, *module_figures(profile.modules))
