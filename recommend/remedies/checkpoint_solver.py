"""Which modules to checkpoint: least recompute time whose predicted peak fits a budget.

Chains (a ModuleList/Sequential of blocks) are solved exactly over the memory
model of ``memory_model``: the model's peak has a max term (the block being
recomputed), so we enumerate its value R (the largest activation of a chosen
block) and, for each R, solve "least time with kept(S) <= budget - base - R over
blocks with a_i <= R" by dynamic programming over the blocks on Pareto labels
(kept bytes, time), with a state for "previous block checkpointed" because a
run of checkpointed blocks shares its boundaries. Labels are real plans, so
every answer's predicted peak is re-checked with the model itself. R values are
tried in order of a fractional-knapsack lower bound and skipped once that
bound cannot beat the best plan (branch and bound, still exact). Rotor
(Beaumont et al.) discretises memory instead; exact labels keep small chains
provably optimal (tests compare with brute force) and a label cap keeps long
ones fast (then near-optimal, never infeasible).

General module trees fall back to a greedy choice over non-overlapping modules
by memory saved per recompute second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from advisor.recommend.memory_model import (
    Chain,
    chain_from_profile,
    predicted_peak,
    recompute_s,
    units_from_modules,
)
from advisor.recommend.profile import Profile
from advisor.records.advice import CurvePoint

LABEL_CAP = 256  # Pareto labels kept per DP state on long chains; above it labels are thinned by memory buckets
EXACT_BLOCKS = 16  # chains up to this length are never thinned and try every recompute level
R_LEVELS = 8  # longer chains try at most this many recompute levels (quantiles of the block sizes)
BRUTE_FORCE_MAX = 20


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A checkpointing plan: which units, with predicted peak (bytes) and added time (s).

    ``feasible`` is False when nothing fits ``budget_bytes``; the plan is then
    the one with the lowest predicted peak (``peak_bytes`` is the best achievable).
    """

    modules: tuple[str, ...]
    indices: tuple[int, ...]
    peak_bytes: int
    overhead_s: float
    budget_bytes: int | None
    baseline_peak_bytes: int
    feasible: bool
    method: str  # "dp", "greedy", "chen", "periodic", "brute_force"
    exact: bool = True  # whether the method guarantees the optimum under the model
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "modules": list(self.modules),
            "indices": list(self.indices),
            "peak_bytes": self.peak_bytes,
            "overhead_s": self.overhead_s,
            "budget_bytes": self.budget_bytes,
            "baseline_peak_bytes": self.baseline_peak_bytes,
            "feasible": self.feasible,
            "method": self.method,
            "exact": self.exact,
            "extra": dict(self.extra),
        }


def make_plan(chain: Chain, indices: list[int] | tuple[int, ...], budget: int | None, method: str, *, exact: bool = True) -> Plan:
    """Evaluate a selection with the memory model and wrap it as a ``Plan``."""
    idx = tuple(sorted(set(indices)))
    peak = predicted_peak(chain, set(idx))
    return Plan(
        modules=tuple(chain.blocks[i].name for i in idx),
        indices=idx,
        peak_bytes=peak,
        overhead_s=recompute_s(chain, set(idx)),
        budget_bytes=budget,
        baseline_peak_bytes=chain.baseline_peak_bytes,
        feasible=budget is None or peak <= budget,
        method=method,
        exact=exact,
    )


# ---------------------------------------------------------------- chain DP ---------------
def _arrays(chain: Chain) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    a = np.array([b.activation_bytes for b in chain.blocks], dtype=np.int64)
    x = np.array([b.input_bytes for b in chain.blocks], dtype=np.int64)
    y = np.array([b.output_bytes for b in chain.blocks], dtype=np.int64)
    f = np.array([b.recompute_s for b in chain.blocks], dtype=np.float64)
    return a, x, y, f


def _merge(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Merge Pareto lists (each ascending mem, descending time) into one, thinned to about ``cap``.

    Returns (mem, time, src, thinned). A stable sort on runs that are already
    sorted is linear; an equal-memory pair may both survive, which is harmless.
    """
    if len(parts) == 1:
        mem, time, src = parts[0]
    else:
        mem = np.concatenate([p[0] for p in parts])
        order = np.argsort(mem, kind="stable")
        mem = mem[order]
        time = np.concatenate([p[1] for p in parts])[order]
        src = np.concatenate([p[2] for p in parts])[order]
        best_before = np.empty_like(time)
        best_before[0] = np.inf
        np.minimum.accumulate(time[:-1], out=best_before[1:])
        keep = time < best_before
        mem, time, src = mem[keep], time[keep], src[keep]
    if len(mem) <= cap:
        return mem, time, src, False
    # Bucket by memory; keep each bucket's fastest label (the last, times descend) and the leanest
    # label, so the minimum-memory plan (hence feasibility) always survives.
    width = max(1.0, float(mem[-1] - mem[0]) / cap)
    bucket = ((mem - mem[0]) // width).astype(np.int64)
    last = np.empty(len(mem), dtype=bool)
    last[:-1] = bucket[1:] != bucket[:-1]
    last[-1] = True
    last[0] = True
    return mem[last], time[last], src[last], True


def _chain_dp(chain: Chain, allowed: np.ndarray, capacity: int, cap: int) -> tuple[list[int], float, bool] | None:
    """Least-time selection among ``allowed`` blocks with kept bytes <= capacity; None if none fits."""
    a, x, y, f = _arrays(chain)
    n = chain.n
    contiguous = chain.contiguous
    # Least bytes blocks i.. can still keep: a lower bound used to drop hopeless labels early.
    least = np.where(allowed, np.minimum(a, x), a)
    suffix = np.concatenate((np.cumsum(least[::-1])[::-1], [0]))
    empty = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64))
    # labels[s] = (mem, time), Pareto-sorted; s = 1 when the previous block is checkpointed.
    labels = [(np.zeros(1, np.int64), np.zeros(1)), (np.zeros(0, np.int64), np.zeros(0))]
    parents: list[list[np.ndarray]] = []  # per block, per state: parent label encoded as index * 2 + state
    thinned = False
    for i in range(n):
        limit = capacity - int(suffix[i + 1])
        new = []
        block_parents = []
        for s in (0, 1):
            parts = []
            if s == 1 and not allowed[i]:
                new.append(empty[:2])
                block_parents.append(empty[2])
                continue
            for p in (0, 1):
                pm, pt = labels[p]
                if s == 0:
                    add = int(a[i]) + (int(y[i - 1]) if (p == 1 and contiguous) else 0)
                    dt = 0.0
                else:
                    add = int(x[i]) + (0 if contiguous else int(y[i]))
                    dt = float(f[i])
                k = int(np.searchsorted(pm, limit - add, side="right"))  # labels that can still fit
                if k:
                    parts.append((pm[:k] + add, pt[:k] + dt, np.arange(k, dtype=np.int64) * 2 + p))
            if not parts:
                new.append(empty[:2])
                block_parents.append(empty[2])
                continue
            m, t, src, cut = _merge(parts, cap)
            thinned |= cut
            new.append((m, t))
            block_parents.append(src)
        labels = new
        parents.append(block_parents)
    best: tuple[float, int, int, int] | None = None  # (time, mem, state, index)
    for s in (0, 1):
        m, t = labels[s]
        if len(m) == 0:
            continue
        final = m + (y[n - 1] if (s == 1 and contiguous) else 0)
        ok = np.nonzero(final <= capacity)[0]
        if len(ok) == 0:
            continue
        j = ok[np.lexsort((final[ok], t[ok]))[0]]
        cand = (float(t[j]), int(final[j]), s, int(j))
        if best is None or cand[:2] < best[:2]:
            best = cand
    if best is None:
        return None
    _, _, s, j = best
    chosen = []
    for i in range(n - 1, -1, -1):
        if s == 1:
            chosen.append(i)
        code = int(parents[i][s][j])
        s, j = code % 2, code // 2
    return sorted(chosen), best[0], thinned


def _min_kept(chain: Chain, thresholds: np.ndarray) -> np.ndarray:
    """Least kept bytes for each threshold R (blocks with a_i <= R allowed): a two-state DP over
    the blocks, vectorised across the thresholds."""
    a, x, y, _ = _arrays(chain)
    r = np.asarray(thresholds, dtype=np.int64)
    big = np.iinfo(np.int64).max // 4  # "impossible", far from overflow when bytes are added
    off = np.zeros(len(r), dtype=np.int64)  # best kept so far with the previous block not checkpointed
    on = np.full(len(r), big, dtype=np.int64)  # ... with the previous block checkpointed
    for i in range(chain.n):
        exit_y = int(y[i - 1]) if (i > 0 and chain.contiguous) else 0
        new_off = np.minimum(off, on + exit_y) + int(a[i])
        cost_on = int(x[i]) + (0 if chain.contiguous else int(y[i]))
        new_on = np.where(a[i] <= r, np.minimum(off, on) + cost_on, big)
        off, on = new_off, np.minimum(new_on, big)
    last_y = int(y[-1]) if chain.contiguous and chain.n else 0
    return np.minimum(off, on + last_y)


def _lower_bound(a: np.ndarray, x: np.ndarray, f: np.ndarray, allowed: np.ndarray, need: int) -> float:
    """Fractional knapsack bound on the time needed to save ``need`` bytes (a block saves at most a - x)."""
    if need <= 0:
        return 0.0
    save = np.where(allowed, a - x, 0).astype(np.float64)
    useful = save > 0
    if save[useful].sum() < need:
        return math.inf
    ratio = f[useful] / save[useful]
    order = np.argsort(ratio, kind="stable")
    s, t = save[useful][order], f[useful][order]
    cum = np.cumsum(s)
    k = int(np.searchsorted(cum, need))
    before = cum[k - 1] if k else 0.0
    return float(t[:k].sum() + t[k] * (need - before) / s[k])


def min_peak_plan(chain: Chain) -> Plan:
    """The plan with the lowest predicted peak (ties: least time), exact under the model."""
    a, _, _, _ = _arrays(chain)
    best_peak, best_r = chain.baseline_peak_bytes, 0
    thresholds = np.unique(a[a > 0])
    if len(thresholds):
        peaks = chain.base_bytes + thresholds + _min_kept(chain, thresholds)
        k = int(np.argmin(peaks))  # first minimum: the smallest R among equal peaks
        if peaks[k] < best_peak:
            best_peak, best_r = int(peaks[k]), int(thresholds[k])
    if best_r == 0:
        return make_plan(chain, [], None, "dp")
    found = _chain_dp(chain, a <= best_r, best_peak - chain.base_bytes - best_r, _cap(chain))
    assert found is not None  # the min-kept selection fits by construction
    return make_plan(chain, found[0], None, "dp", exact=not found[2])


def _levels(chain: Chain, a: np.ndarray) -> np.ndarray:
    """Values tried for the recompute term R: every distinct block size on short chains; on long
    ones, R_LEVELS of them spread by rank (always the largest). A plan found under level R is
    still valid (its real max is <= R); only optimality can suffer, by the gap to the next level."""
    levels = np.unique(a[a > 0])
    if chain.n <= EXACT_BLOCKS or len(levels) <= R_LEVELS:
        return levels
    picks = np.unique(np.round(np.linspace(0, len(levels) - 1, R_LEVELS)).astype(np.int64))
    return levels[picks]


def _cap(chain: Chain) -> int:
    """No thinning up to EXACT_BLOCKS blocks (2**n labels at most), so small chains are provably exact."""
    return max(LABEL_CAP, 2**chain.n) if chain.n <= EXACT_BLOCKS else LABEL_CAP


def solve_chain(chain: Chain, budget_bytes: int, *, cap: int | None = None) -> Plan:
    """Least-recompute plan for a chain whose predicted peak fits ``budget_bytes``.

    When none fits, returns the lowest-peak plan with ``feasible=False``.
    """
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    if chain.baseline_peak_bytes <= budget_bytes or chain.n == 0:
        return make_plan(chain, [], budget_bytes, "dp")
    a, x, _, f = _arrays(chain)
    total_a = int(a.sum())
    thresholds = _levels(chain, a)
    capacities = budget_bytes - chain.base_bytes - thresholds
    reachable = _min_kept(chain, thresholds) <= capacities  # R values where some plan fits at all
    candidates = []
    for r, capacity in zip(thresholds[reachable].tolist(), capacities[reachable].tolist()):
        bound = _lower_bound(a, x, f, a <= r, total_a - capacity)
        if math.isfinite(bound):
            candidates.append((bound, r, capacity))
    candidates.sort()
    best: tuple[float, list[int]] | None = None
    approximate = False
    for bound, r, capacity in candidates:
        if best is not None and bound >= best[0]:
            break  # no later R can beat the best plan: bounds are sorted
        found = _chain_dp(chain, a <= r, capacity, cap or _cap(chain))
        if found is None:
            continue
        approximate |= found[2]
        if best is None or found[1] < best[0]:
            best = (found[1], found[0])
    if best is None:
        lowest = min_peak_plan(chain)
        return Plan(**{**_fields(lowest), "budget_bytes": budget_bytes, "feasible": False})
    plan = make_plan(chain, best[1], budget_bytes, "dp", exact=not approximate)
    if not plan.feasible:  # cannot happen: labels are real plans; the model is re-checked anyway
        raise RuntimeError(f"solver produced a plan over budget: {plan.peak_bytes} > {budget_bytes}")
    return plan


def _fields(plan: Plan) -> dict[str, Any]:
    return {name: getattr(plan, name) for name in plan.__dataclass_fields__}


# ---------------------------------------------------------------- heuristics and checks ---
def periodic(chain: Chain, period: int, budget_bytes: int | None = None) -> Plan:
    """Checkpoint every ``period``-th block (blocks period-1, 2*period-1, ...)."""
    if period < 1:
        raise ValueError(f"period must be >= 1, got {period}")
    return make_plan(chain, list(range(period - 1, chain.n, period)), budget_bytes, "periodic", exact=False)


def chen_sqrt_n(chain: Chain, budget_bytes: int | None = None) -> Plan:
    """Chen et al.'s periodic heuristic in module-wrapping form: checkpoint every ceil(sqrt(n))-th block.

    Chen keeps one boundary per sqrt(n) layers and recomputes segments; when
    the executor can only wrap whole modules, the periodic choice is to wrap
    one block in every sqrt(n) (as torchtitan's layer-frequency AC does).
    """
    period = max(1, math.ceil(math.sqrt(chain.n)))
    plan = periodic(chain, period, budget_bytes)
    return Plan(**{**_fields(plan), "method": "chen"})


def brute_force(chain: Chain, budget_bytes: int) -> Plan:
    """Every subset (tests only): least time that fits, ties to lower peak; else the lowest peak.

    Evaluates the model for all 2**n masks at once; ``make_plan`` then re-checks
    the chosen one with ``predicted_peak`` itself.
    """
    if chain.n > BRUTE_FORCE_MAX:
        raise ValueError(f"brute force is for chains of at most {BRUTE_FORCE_MAX} blocks, got {chain.n}")
    if chain.n == 0:
        return make_plan(chain, [], budget_bytes, "brute_force")
    a, x, y, f = _arrays(chain)
    masks = ((np.arange(2**chain.n)[:, None] >> np.arange(chain.n)) & 1).astype(bool)
    nxt = np.zeros_like(masks)
    if chain.contiguous:
        nxt[:, :-1] = masks[:, 1:]
    kept = (~masks) @ a + masks @ x + (masks & ~nxt) @ y
    peak = chain.base_bytes + kept + (masks * a).max(axis=1)
    time = masks.astype(np.float64) @ f
    fits = np.nonzero(peak <= budget_bytes)[0]
    if len(fits):
        pick = fits[np.lexsort((peak[fits], time[fits]))[0]]
    else:
        pick = np.lexsort((time, peak))[0]
    return make_plan(chain, np.nonzero(masks[pick])[0].tolist(), budget_bytes, "brute_force")


def tradeoff_curve(chain: Chain, points: int = 12) -> list[CurvePoint]:
    """Best plan at ``points`` budgets from the lowest achievable peak to the unconstrained one."""
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points}")
    low = min_peak_plan(chain).peak_bytes
    high = chain.baseline_peak_bytes
    out: list[CurvePoint] = []
    for k in range(points):
        budget = int(round(low + (high - low) * k / (points - 1)))
        plan = solve_chain(chain, budget)
        out.append(
            CurvePoint(budget_bytes=budget, overhead_s=plan.overhead_s, peak_memory_bytes=plan.peak_bytes, modules_count=len(plan.indices))
        )
    return out


# ---------------------------------------------------------------- general module trees ---
def greedy_tree(profile: Profile, budget_bytes: int) -> tuple[Chain, Plan] | None:
    """Non-overlapping modules by bytes saved per recompute second, until the peak fits.

    Saved bytes of a module alone: a - x - y (it keeps its input and output).
    Returns None when no module would save anything.
    """
    candidates = []
    for m in profile.modules:
        if m.name == "":
            continue
        saving = profile.subtree_activation(m.name) - m.input_bytes - m.output_bytes
        if saving > 0:
            candidates.append((saving / max(m.forward_s, 1e-12), saving, m))
    if not candidates:
        return None
    candidates.sort(key=lambda c: (-c[0], -c[1], c[2].name))
    chosen: list = []
    chain = units_from_modules(profile, chosen, contiguous=False)
    peak = best_peak = chain.baseline_peak_bytes
    best = (chain, [])
    for _, _, m in candidates:
        if peak <= budget_bytes:
            break
        if any(profile.is_ancestor(c.name, m.name) or profile.is_ancestor(m.name, c.name) for c in chosen):
            continue
        # Taken even when the peak does not drop yet: the recompute term (the largest module) is
        # paid once, so savings only show after a second module joins.
        chosen.append(m)
        chain = units_from_modules(profile, chosen, contiguous=False)
        peak = predicted_peak(chain, set(range(chain.n)))
        if peak < best_peak:
            best_peak, best = peak, (chain, list(chosen))
    chain, chosen = best
    # Drop modules the budget no longer needs, most recompute time first.
    for m in sorted(chosen, key=lambda c: -c.forward_s):
        rest = [c for c in chosen if c is not m]
        trial = units_from_modules(profile, rest, contiguous=False)
        if rest and predicted_peak(trial, set(range(trial.n))) <= budget_bytes:
            chosen, chain = rest, trial
    plan = make_plan(chain, list(range(chain.n)), budget_bytes, "greedy", exact=False)
    return chain, plan


def solve_checkpointing(profile_or_chain: Profile | Chain, budget_bytes: int) -> Plan | None:
    """Least-recompute checkpointing plan under ``budget_bytes``.

    A ``Chain`` is solved exactly; a ``Profile`` uses its block chain when it
    has one (and the greedy tree fallback when that chain cannot fit), else the
    greedy fallback. Returns None when there is nothing to checkpoint; a plan
    with ``feasible=False`` (the lowest peak found) when nothing fits.
    """
    if isinstance(profile_or_chain, Chain):
        return solve_chain(profile_or_chain, budget_bytes)
    if not isinstance(profile_or_chain, Profile):
        raise ValueError(f"expected a Profile or a Chain, got {type(profile_or_chain).__name__}")
    chain = chain_from_profile(profile_or_chain)
    plan = solve_chain(chain, budget_bytes) if chain is not None else None
    if plan is not None and plan.feasible:
        return plan
    fallback = greedy_tree(profile_or_chain, budget_bytes)
    if fallback is not None and (plan is None or fallback[1].feasible or fallback[1].peak_bytes < plan.peak_bytes):
        return fallback[1]
    return plan
