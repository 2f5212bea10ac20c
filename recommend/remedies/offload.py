"""The joint solver: keep, recompute or offload each block of a chain, and optionally the
optimizer state, so the predicted peak fits a budget at the least predicted step time.

Memory (extends ``memory_model``'s conservative peak; c_i in {K, R, O}, last block never O):

    kept(c) = sum_K a_i + sum_R (x_i + y_i when the next block is not R) + sum_O 0
    peak(c) = base - [opt] S + kept(c) + max( max_R a_i,  max_O (a_i + [c_{i-1} = O] a_{i-1}) )
    peak   = max(peak(c), step_peak)            when the optimizer state is offloaded

  An offloaded block keeps nothing on the device until its backward, when its tensors come back
  together with the previous block's (prefetched ahead of use); a recomputed block brings back
  its activations as in checkpointing. ``S``: optimizer-state bytes; ``step_peak``: what is
  resident during ``step()`` when the state is back (parameters + gradients + state).

Time (seconds added to the step; bandwidth ``bw`` in bytes/s per direction, pinned copies):

    R:   f_i                                              (one more forward)
    O:   max(0, a_i/bw - f_{i+1})                         (the device-to-host copy hides behind
                                                           the next block's forward)
       + max(0, a_i/bw - B f_{i+1})  when block i+1 is offloaded too: its first use in backward
                                     prefetches block i, hidden behind its backward (``B`` =
                                     BACKWARD_FACTOR times its forward)
       + a_i/bw                      otherwise (fetched when first used: exposed)
    opt: 2 S / bw                                         (state up before the step, down after;
                                                           the applier's chunked step hides only
                                                           the step's own compute, not counted)

Where a deep step's timeline covers the chain (``solve(..., memory=...)``), the peak is not this
formula but ``peak_model``'s replay of the measured timeline with offloaded blocks (exact against
the tracker within 2% on examples/gpt.py, where the formula over-predicts by 12-42%:
``bench/offload.py``), solved by ``peak_model.solve_choices`` with the same time terms
(``step_cost``); the optimizer-state option lowers every instant but ``step()`` by S.

Formula path, exact for chains: the max term is enumerated over its possible values M (every a_i and
a_i + a_{i-1}); for each M a dynamic program over the blocks with the previous block's choice as
state keeps Pareto labels (kept bytes, time) under capacity budget - base - M. Labels are real
plans, re-checked with ``evaluate``. Tests compare with ``brute_force`` (3**n plans).
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Sequence

from advisor.recommend.memory_model import Chain
from advisor.recommend.peak_model import (  # the choice names are peak_model's, re-exported here
    CHOICES,
    KEEP,
    OFFLOAD,
    RECOMPUTE,
    ChainMemory,
    Cost,
    choices_peak,
    lowest_choices,
    solve_choices,
)
from advisor.records.advice import CurvePoint
from advisor.records.units import fmt_seconds

BACKWARD_FACTOR = 2.0  # backward of a block ~ twice its forward (two matmuls per forward one)
LABEL_CAP = 4096  # Pareto labels per state on short chains; above it the answer is flagged not exact
EXACT_BLOCKS = 16  # longer chains: LONG_CAP labels and LONG_LEVELS max-term levels (flagged not exact)
LONG_CAP = 128
LONG_LEVELS = 8
BRUTE_FORCE_MAX = 10


@dataclass(frozen=True, kw_only=True)
class Model:
    """What the joint model needs beyond the chain (bytes, bytes/s)."""

    bandwidth: float  # host link, per direction
    optimizer_state_bytes: int = 0
    step_peak_bytes: int = 0  # resident during step() with the state on the device
    overlap: bool = True  # False where copies cannot run beside compute (a CPU-only device): all exposed


@dataclass(frozen=True, kw_only=True)
class JointPlan:
    choices: tuple[str, ...]
    offload_optimizer: bool
    peak_bytes: int
    overhead_s: float
    feasible: bool
    exact: bool = True
    method: str = "dp"

    def blocks(self, chain: Chain, kind: str) -> list[str]:
        return [b.name for b, c in zip(chain.blocks, self.choices) if c == kind]

    def cost_parts(self, chain: Chain, model: Model) -> dict[str, float]:
        """Seconds added by each option in this plan."""
        out = {RECOMPUTE: 0.0, OFFLOAD: 0.0, "optimizer": 0.0}
        for i, c in enumerate(self.choices):
            if c == RECOMPUTE:
                out[RECOMPUTE] += chain.blocks[i].recompute_s
            elif c == OFFLOAD:
                out[OFFLOAD] += offload_cost(chain, model, i, i + 1 < chain.n and self.choices[i + 1] == OFFLOAD)
        if self.offload_optimizer:
            out["optimizer"] = optimizer_cost(model)
        return out


def offload_cost(chain: Chain, model: Model, i: int, next_offloaded: bool = True) -> float:
    """Exposed copy seconds of offloading block i (see the module docstring)."""
    return _forward_part(chain, model, i) + _backward_part(chain, model, i, next_offloaded)


def _forward_part(chain: Chain, model: Model, i: int) -> float:
    nxt = chain.blocks[i + 1].forward_s if i + 1 < chain.n and model.overlap else 0.0
    return max(0.0, chain.blocks[i].activation_bytes / model.bandwidth - nxt)


def _backward_part(chain: Chain, model: Model, i: int, next_offloaded: bool) -> float:
    copy = chain.blocks[i].activation_bytes / model.bandwidth
    if not next_offloaded or i + 1 >= chain.n or not model.overlap:
        return copy
    return max(0.0, copy - BACKWARD_FACTOR * chain.blocks[i + 1].forward_s)


def hidden_behind(chain: Chain, i: int, next_offloaded: bool) -> float:
    """Compute seconds block i's copies overlap: the next block's forward, and its backward
    when that block is offloaded too (its first use prefetches block i)."""
    nxt = chain.blocks[i + 1].forward_s if i + 1 < chain.n else 0.0
    return nxt * (1.0 + (BACKWARD_FACTOR if next_offloaded else 0.0))


def optimizer_cost(model: Model) -> float:
    return 2.0 * model.optimizer_state_bytes / model.bandwidth


def step_cost(chain: Chain, model: Model) -> Cost:
    """Seconds added when block i takes ``c`` after block i-1 took ``prev`` (the time terms of
    the module docstring, in the order the dynamic programs meet them): a recomputed block's
    forward, an offloaded block's exposed device-to-host copy, and the previous offloaded block's
    exposed fetch, which depends on whether this block is offloaded too (``peak_model.Cost``)."""
    fwd = [_forward_part(chain, model, i) for i in range(chain.n)]
    bwd = [(_backward_part(chain, model, i, False), _backward_part(chain, model, i, True)) for i in range(chain.n)]

    def cost(i: int, prev: str | None, c: str | None) -> float:
        dt = chain.blocks[i].recompute_s if c == RECOMPUTE else fwd[i] if c == OFFLOAD else 0.0
        return dt + (bwd[i - 1][c == OFFLOAD] if prev == OFFLOAD else 0.0)

    return cost


def _check(chain: Chain, choices: Sequence[str]) -> None:
    if len(choices) != chain.n or any(c not in CHOICES for c in choices):
        raise ValueError(f"choices must be {chain.n} of {CHOICES}, got {list(choices)!r}")
    if chain.n and choices[-1] == OFFLOAD:
        raise ValueError("the last block before the loss is never offloaded")


def _formula_peak(chain: Chain, choices: Sequence[str]) -> int:
    """The conservative chain formula's peak (module docstring), optimizer state on the device."""
    kept, top = 0, 0
    for i, (b, c) in enumerate(zip(chain.blocks, choices)):
        if c == KEEP:
            kept += b.activation_bytes
        elif c == RECOMPUTE:
            nxt_r = chain.contiguous and i + 1 < chain.n and choices[i + 1] == RECOMPUTE
            kept += b.input_bytes + (0 if nxt_r else b.output_bytes)
            top = max(top, b.activation_bytes)
        else:
            prev = chain.blocks[i - 1].activation_bytes if i and choices[i - 1] == OFFLOAD else 0
            top = max(top, b.activation_bytes + prev)
    return chain.base_bytes + kept + top


def evaluate(chain: Chain, model: Model, choices: Sequence[str], offload_optimizer: bool,
             memory: ChainMemory | None = None) -> tuple[int, float]:
    """(predicted peak bytes, added seconds) of one plan; ``ValueError`` on an invalid plan.
    With ``memory`` (the chain's measured timeline) the peak is ``peak_model``'s simulation,
    else the conservative formula."""
    _check(chain, choices)
    peak = choices_peak(memory, choices) if memory is not None else _formula_peak(chain, choices)
    cost = step_cost(chain, model)
    time = sum(cost(i, choices[i - 1] if i else None, c) for i, c in enumerate(choices))
    if offload_optimizer:
        peak = max(peak - model.optimizer_state_bytes, model.step_peak_bytes)
        time += optimizer_cost(model)
    return peak, time


def _pareto(labels: list[tuple[int, float, tuple[str, ...]]], cap: int = LABEL_CAP
            ) -> tuple[list[tuple[int, float, tuple[str, ...]]], bool]:
    labels.sort(key=lambda l: (l[0], l[1]))
    out: list[tuple[int, float, tuple[str, ...]]] = []
    for label in labels:
        if not out or label[1] < out[-1][1]:
            out.append(label)
    if len(out) <= cap:
        return out, False
    step = len(out) / cap  # thin evenly, keeping the leanest and the fastest
    keep = sorted({0, len(out) - 1} | {int(k * step) for k in range(cap)})
    return [out[k] for k in keep], True


def _dp(chain: Chain, cost: Cost, allowed: frozenset[str], level: int, capacity: int
        ) -> tuple[tuple[str, ...], float, bool] | None:
    """Least-time plan with kept <= capacity and every max-term entry <= level (the formula
    model); with a zero ``cost``, the plan keeping the fewest bytes."""
    a = [b.activation_bytes for b in chain.blocks]
    states: dict[str | None, list[tuple[int, float, tuple[str, ...]]]] = {None: [(0, 0.0, ())]}
    thinned = False
    for i, b in enumerate(chain.blocks):
        new: dict[str, list[tuple[int, float, tuple[str, ...]]]] = {}
        for prev, labels in states.items():
            for c in CHOICES:
                if c not in allowed:
                    continue
                if c == RECOMPUTE and a[i] > level:
                    continue
                if c == OFFLOAD and (i == chain.n - 1 or a[i] + (a[i - 1] if prev == OFFLOAD else 0) > level):
                    continue
                # the output of a run of recomputed blocks is paid when the run ends (here or at the end)
                exit_y = chain.blocks[i - 1].output_bytes if prev == RECOMPUTE and (c != RECOMPUTE or not chain.contiguous) else 0
                add = exit_y + (a[i] if c == KEEP else b.input_bytes if c == RECOMPUTE else 0)
                dt = cost(i, prev, c)
                for kept, time, path in labels:
                    if kept + add <= capacity:
                        new.setdefault(c, []).append((kept + add, time + dt, path + (c,)))
        states = {}
        for c, labels in new.items():
            states[c], cut = _pareto(labels, LABEL_CAP if chain.n <= EXACT_BLOCKS else LONG_CAP)
            thinned |= cut
        if not states:
            return None
    best: tuple[float, int, tuple[str, ...]] | None = None
    for last, labels in states.items():
        tail = chain.blocks[-1].output_bytes if last == RECOMPUTE else 0
        for kept, time, path in labels:
            if kept + tail <= capacity and (best is None or (time, kept + tail) < best[:2]):
                best = (time, kept + tail, path)
    return None if best is None else (best[2], best[0], thinned)


def _no_cost(i: int, prev: str | None, c: str | None) -> float:
    return 0.0


def _optimizer_options(model: Model, optimizer: bool | None) -> tuple[bool, ...]:
    opts = (False, True) if optimizer is None else (optimizer,)
    if not model.optimizer_state_bytes:
        opts = tuple(o for o in opts if not o) or (False,)
    return opts


def _better(plan: JointPlan, best: JointPlan | None) -> bool:
    return best is None or (plan.overhead_s, plan.peak_bytes) < (best.overhead_s, best.peak_bytes)


def solve(chain: Chain, model: Model, budget: int, *, allowed: Sequence[str] = CHOICES,
          optimizer: bool | None = None, memory: ChainMemory | None = None) -> JointPlan:
    """Least-time plan under ``budget``; ``allowed``: the per-block options besides keep;
    ``optimizer``: None tries with and without optimizer-state offload, True/False forces it;
    ``memory``: the chain's measured timeline, whose simulated peak (``peak_model``) replaces
    the formula. When nothing fits, the lowest-peak plan found, with ``feasible=False``."""
    allowed_set = frozenset(allowed) | {KEEP}
    if _baseline(chain, memory) <= budget or chain.n == 0:  # fits already: change nothing
        return _unchanged(chain, budget, memory)
    opts = _optimizer_options(model, optimizer)
    if memory is not None:
        return _solve_simulated(chain, memory, model, budget, allowed_set, opts)
    a = [b.activation_bytes for b in chain.blocks]
    levels = sorted({0, *a, *(x + y for x, y in zip(a, a[1:]))})
    coarse = chain.n > EXACT_BLOCKS and len(levels) > LONG_LEVELS
    if coarse:  # a plan found under level M is still valid; only optimality can suffer
        levels = sorted({levels[round(k * (len(levels) - 1) / (LONG_LEVELS - 1))] for k in range(LONG_LEVELS)})
    cost = step_cost(chain, model)
    best: JointPlan | None = None
    for opt in opts:
        # (the optimizer's own time is added once; only the chain part is optimised per level)
        base = chain.base_bytes - (model.optimizer_state_bytes if opt else 0)
        if opt and model.step_peak_bytes > budget:
            continue
        for level in levels:
            found = _dp(chain, cost, allowed_set, level, budget - base - level)
            if found is None:
                continue
            peak, time = evaluate(chain, model, found[0], opt)
            plan = JointPlan(choices=found[0], offload_optimizer=opt, peak_bytes=peak, overhead_s=time,
                             feasible=peak <= budget, exact=not (found[2] or coarse))
            if plan.feasible and _better(plan, best):
                best = plan
    if best is not None:
        return best
    lowest: JointPlan | None = None
    for opt in opts:  # nothing fits: report the leanest plan (every block at its leanest choice)
        for level in levels:
            leanest = _dp(chain, _no_cost, allowed_set, level, sys.maxsize)
            assert leanest is not None  # no capacity: every level admits keep-everything
            peak, time = evaluate(chain, model, leanest[0], opt)
            plan = JointPlan(choices=leanest[0], offload_optimizer=opt, peak_bytes=peak, overhead_s=time, feasible=False)
            if lowest is None or plan.peak_bytes < lowest.peak_bytes:
                lowest = plan
    assert lowest is not None
    return lowest


def _solve_simulated(chain: Chain, memory: ChainMemory, model: Model, budget: int, allowed: frozenset[str],
                     opts: tuple[bool, ...]) -> JointPlan:
    """``solve`` over the simulated timeline: one exact program per optimizer option (the state
    offload lowers every instant but ``step()`` by S, so the chain may use budget + S)."""
    if len(memory.blocks) != chain.n:
        raise ValueError(f"the timeline has {len(memory.blocks)} blocks, the chain {chain.n}")
    cost = step_cost(chain, model)
    best: JointPlan | None = None
    for opt in opts:
        if opt and model.step_peak_bytes > budget:
            continue
        room = budget + (model.optimizer_state_bytes if opt else 0)
        found = solve_choices(memory, room, cost, allowed=tuple(allowed), front_limit=LABEL_CAP)
        if found is None:
            continue
        peak, time = evaluate(chain, model, found.choices, opt, memory)
        plan = JointPlan(choices=found.choices, offload_optimizer=opt, peak_bytes=peak, overhead_s=time,
                         feasible=peak <= budget, exact=found.exact, method="dp-simulated")
        if plan.feasible and _better(plan, best):
            best = plan
    if best is not None:
        return best
    lowest: JointPlan | None = None
    leanest = lowest_choices(memory, allowed=tuple(allowed), front_limit=LABEL_CAP)
    for opt in opts:
        peak, time = evaluate(chain, model, leanest.choices, opt, memory)
        plan = JointPlan(choices=leanest.choices, offload_optimizer=opt, peak_bytes=peak, overhead_s=time,
                         feasible=False, exact=leanest.exact, method="dp-simulated")
        if lowest is None or plan.peak_bytes < lowest.peak_bytes:
            lowest = plan
    assert lowest is not None
    return lowest


def _baseline(chain: Chain, memory: ChainMemory | None) -> int:
    return memory.measured_peak_bytes if memory is not None else chain.baseline_peak_bytes


def _unchanged(chain: Chain, budget: int, memory: ChainMemory | None = None) -> JointPlan:
    peak = _baseline(chain, memory)
    return JointPlan(choices=(KEEP,) * chain.n, offload_optimizer=False, peak_bytes=peak, overhead_s=0.0,
                     feasible=peak <= budget)


def brute_force(chain: Chain, model: Model, budget: int, *, allowed: Sequence[str] = CHOICES,
                optimizer: bool | None = None, memory: ChainMemory | None = None) -> JointPlan:
    """Every plan (tests only): least time that fits, ties to the lower peak; else the lowest peak."""
    if chain.n > BRUTE_FORCE_MAX:
        raise ValueError(f"brute force is for chains of at most {BRUTE_FORCE_MAX} blocks, got {chain.n}")
    if _baseline(chain, memory) <= budget or chain.n == 0:
        return _unchanged(chain, budget, memory)
    options = [c for c in CHOICES if c in set(allowed) | {KEEP}]
    fits: list[tuple[float, int, tuple[str, ...], bool]] = []
    every: list[tuple[int, float, tuple[str, ...], bool]] = []
    for opt in _optimizer_options(model, optimizer):
        for choices in itertools.product(options, repeat=chain.n):
            if chain.n and choices[-1] == OFFLOAD:
                continue
            peak, time = evaluate(chain, model, choices, opt, memory)
            every.append((peak, time, choices, opt))
            if peak <= budget:
                fits.append((time, peak, choices, opt))
    if fits:
        time, peak, choices, opt = min(fits, key=lambda f: (f[0], f[1]))
        return JointPlan(choices=choices, offload_optimizer=opt, peak_bytes=peak, overhead_s=time, feasible=True,
                         method="brute_force")
    peak, time, choices, opt = min(every, key=lambda e: (e[0], e[1]))
    return JointPlan(choices=choices, offload_optimizer=opt, peak_bytes=peak, overhead_s=time, feasible=False,
                     method="brute_force")


def tradeoff_curve(chain: Chain, model: Model, points: int = 12, *, allowed: Sequence[str] = CHOICES,
                   memory: ChainMemory | None = None) -> list[CurvePoint]:
    """Best plan (every option allowed) at ``points`` budgets from the leanest to the unconstrained peak.
    ``modules_count``: blocks recomputed or offloaded."""
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points}")
    high = _baseline(chain, memory)
    low = solve(chain, model, 0, allowed=allowed, memory=memory).peak_bytes
    out = []
    for k in range(points):
        budget = int(round(low + (high - low) * k / (points - 1)))
        plan = solve(chain, model, budget, allowed=allowed, memory=memory)
        out.append(CurvePoint(budget_bytes=budget, overhead_s=plan.overhead_s, peak_memory_bytes=plan.peak_bytes,
                              modules_count=sum(c != KEEP for c in plan.choices)))
    return out


# ---------------------------------------------------------------- from a measured profile ---
DEFAULT_BANDWIDTH = 16e9  # bytes/s: PCIe 3.0 x16 nominal (REFERENCE.md), when no measurement reached us
HEADROOM = 0.90  # as checkpointing: plan for this share of the budget first


def bandwidth_of(profile: object) -> tuple[float, str]:
    """(host-link bytes/s, where it came from): the measured ``host_link_bandwidth`` the profile
    carries (probes/device/hostlink.py, or the agent's override), else the nominal assumption."""
    value = getattr(profile, "host_link_bandwidth", None)
    if isinstance(value, (int, float)) and value > 0:
        return float(value), "measured"
    return DEFAULT_BANDWIDTH, "assumed PCIe 3.0 x16 (no host-link measurement)"


def model_for(profile: object) -> Model:
    """The joint model's extras from the categories at the peak (bytes)."""
    cats = dict(getattr(profile, "categories_at_peak", None) or getattr(profile, "categories_max", None) or {})
    state = int(cats.get("optimizer_state", 0))
    step_peak = int(cats.get("parameter", 0)) + int(cats.get("gradient", 0)) + state
    return Model(bandwidth=bandwidth_of(profile)[0], optimizer_state_bytes=state, step_peak_bytes=step_peak)


def fitting(chain: Chain, model: Model, budget: int, **kw: object) -> JointPlan:
    """The least-time plan under ``HEADROOM`` of the budget, else under the budget itself."""
    plan = solve(chain, model, int(HEADROOM * budget), **kw)  # type: ignore[arg-type]
    return plan if plan.feasible else solve(chain, model, budget, **kw)  # type: ignore[arg-type]


def why(chain: Chain, model: Model, plan: JointPlan) -> list[str]:
    """One line per changed block: why its option beat the others."""
    out = []
    for i, c in enumerate(plan.choices):
        if c == KEEP:
            continue
        b = chain.blocks[i]
        copy = b.activation_bytes / model.bandwidth
        recompute = f"recompute would cost {fmt_seconds(b.recompute_s)}"
        nxt_o = i + 1 < chain.n and plan.choices[i + 1] == OFFLOAD
        if c == OFFLOAD:
            out.append(f"{b.name}: offload ({fmt_seconds(copy)} each way) hides behind "
                       f"{fmt_seconds(hidden_behind(chain, i, nxt_o))} of the next block's forward"
                       f"{' and backward' if nxt_o else ''}, exposing {fmt_seconds(offload_cost(chain, model, i, nxt_o))}; "
                       f"{recompute}")
        elif i + 1 < chain.n:
            out.append(f"{b.name}: recompute costs {fmt_seconds(b.recompute_s)}; offload would expose at least "
                       f"{fmt_seconds(offload_cost(chain, model, i, True))} ({fmt_seconds(copy)} copies)")
        else:
            out.append(f"{b.name}: recompute costs {fmt_seconds(b.recompute_s)} (the last block is never offloaded)")
    return out
