"""Per-step figures the bottleneck rules share: op time per step, matmul ops, collectives per step.

Ops and collectives come from deep-sampled steps (``Profile.ops``, ``Profile.collectives``, one
rank); a figure "per step" is the sum over those records divided by the number of distinct steps
they cover. Times in seconds, sizes in bytes.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Mapping, Sequence

from advisor.records.samples import CollectiveStat, OpStat
from advisor.records.units import fmt_seconds

# aten packets whose time tensor cores shorten (matrix multiplies, convolutions, attention)
MATMUL_OPS: frozenset[str] = frozenset({
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear",
    "aten.convolution", "aten._convolution", "aten.convolution_backward", "aten.cudnn_convolution",
    "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_efficient_attention_backward",
    "aten._scaled_dot_product_flash_attention_backward", "aten._scaled_dot_product_cudnn_attention_backward",
})
FP32_DTYPES: frozenset[str] = frozenset({"float32", "torch.float32", "float", "torch.float"})


def steps_covered(records: Iterable[OpStat | CollectiveStat]) -> int:
    """How many distinct steps the records come from (at least 1)."""
    return max(1, len({r.step for r in records}))


def op_time_per_step(ops: Sequence[OpStat]) -> float:
    """Seconds of op (kernel) time per step: the sum of ``OpStat.time_s`` over the steps covered."""
    return sum(o.time_s for o in ops) / steps_covered(ops) if ops else 0.0


def matmul_ops(ops: Sequence[OpStat]) -> list[OpStat]:
    return [o for o in ops if o.name in MATMUL_OPS]


def comm_steps(collectives: Sequence[CollectiveStat]) -> dict[int, list[CollectiveStat]]:
    """Collectives by step, without step 0 when later steps exist (DDP's start-up broadcasts)."""
    by_step: dict[int, list[CollectiveStat]] = {}
    for c in collectives:
        by_step.setdefault(c.step, []).append(c)
    if len(by_step) > 1:
        by_step.pop(min(by_step), None)
    return by_step


def median_per_step(by_step: Mapping[int, Sequence[CollectiveStat]], attr: str) -> float:
    """Median over steps of the per-step sum of ``attr`` (``exposed_s``, ``time_s``, ``bytes``)."""
    if not by_step:
        return 0.0
    return float(statistics.median(sum(getattr(c, attr) for c in calls) for calls in by_step.values()))


def bus_factor(op: str, n: int) -> float:
    """Bytes each rank moves per payload byte (REFERENCE.md, bus bandwidth: ring all-reduce 2(n-1)/n)."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def bus_bandwidth(collectives: Sequence[CollectiveStat]) -> float | None:
    """Bytes/s on the bus, from the largest payload's fastest call (the least latency-bound): bytes x
    ``bus_factor`` / ``time_s``; None without a timed multi-rank call."""
    timed = [c for c in collectives if c.time_s > 0 and c.bytes > 0 and c.group_size > 1]
    if not timed:
        return None
    big = max(timed, key=lambda c: (c.bytes / max(c.count, 1), c.bytes / c.time_s))  # then the fastest
    return big.bytes * bus_factor(big.op, big.group_size) / big.time_s


def ms(seconds: float) -> str:
    """A duration in evidence lines: one unit style everywhere (``fmt_seconds``: 3 significant figures)."""
    return fmt_seconds(seconds)
