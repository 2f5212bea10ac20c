"""The step the memory probe traced, as the Memory view draws it: bytes by category over time.

The memory probe traces whole steps (every allocation, by category) on its own deep steps;
other steps, the compute probe's included, record a few boundary samples only. So the chart
is of the latest step the memory probe traced (``StepSample.deep_probes`` names it; sessions
recorded before that field: the deep step with the most samples), with time in milliseconds
from that step's start (``MemorySample.time`` counts from it). Plain data: no textual here.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.records.samples import MemorySample, StepSample

MAX_POINTS = 600  # more than any chart width; the highest sample of each bucket is kept (the peak survives)


@dataclass(frozen=True, kw_only=True)
class TracePoint:
    time_ms: float  # milliseconds from the step's start (MemorySample.time x 1e3)
    total_bytes: int
    categories: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class TracedStep:
    step: int
    rank: int
    points: list[TracePoint]  # in time order, at most MAX_POINTS
    samples: int  # memory samples recorded in the step (before any thinning)

    @property
    def peak(self) -> TracePoint:
        return max(self.points, key=lambda p: p.total_bytes)


def traced_step_index(steps: list[StepSample], memory: list[MemorySample]) -> int | None:
    """The latest step the memory probe traced, among ``memory``'s steps; None without samples."""
    counts: dict[int, int] = {}
    for sample in memory:
        counts[sample.step] = counts.get(sample.step, 0) + 1
    if not counts:
        return None
    traced = [s.index for s in steps if "memory" in s.deep_probes and s.index in counts]
    if traced:
        return max(traced)
    deep = [s.index for s in steps if s.deep and s.index in counts] or list(counts)
    return max(deep, key=lambda step: (counts[step], step))


def traced_step(steps: list[StepSample], memory: list[MemorySample], rank: int) -> TracedStep | None:
    """The latest memory-traced step of ``rank`` with its samples, or None when it has none."""
    mine = [m for m in memory if m.rank == rank]
    step = traced_step_index([s for s in steps if s.rank == rank], mine)
    if step is None:
        return None
    samples = sorted((m for m in mine if m.step == step), key=lambda m: m.time)
    size = -(-len(samples) // MAX_POINTS)
    kept = [max(samples[i : i + size], key=lambda m: m.total_bytes) for i in range(0, len(samples), size)]
    points = [TracePoint(time_ms=m.time * 1e3, total_bytes=m.total_bytes,
                         categories={c: int(v) for c, v in m.categories.items()}) for m in kept]
    return TracedStep(step=step, rank=rank, points=points, samples=len(samples))
