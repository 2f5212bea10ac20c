"""Time intervals on one clock: union, difference, overlap and the exposed part of a collective.

Torch-free: the comm probe measures exposure with it in the training process, and the recommender
re-analyses recorded sessions with the same code.
"""

from __future__ import annotations

import bisect
from typing import Iterable, Sequence

Interval = tuple[float, float]


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, non-overlapping union of ``intervals`` (empty and reversed ones dropped)."""
    out: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def subtract_intervals(base: Iterable[Interval], remove: Iterable[Interval]) -> list[Interval]:
    """The parts of ``base`` not covered by ``remove`` (both in the same clock)."""
    cuts = merge_intervals(remove)
    cut_ends = [c1 for _, c1 in cuts]
    out: list[Interval] = []
    for start, end in merge_intervals(base):
        cursor = start
        # From the first cut that ends after the start (the cuts are sorted and disjoint): a scan
        # from the first cut each time was quadratic in a long trace's ops.
        k = bisect.bisect_right(cut_ends, cursor)
        while k < len(cuts):
            c0, c1 = cuts[k]
            k += 1
            if c0 >= end:
                break
            if c0 > cursor:
                out.append((cursor, c0))
            cursor = max(cursor, c1)
            if cursor >= end:
                break
        if cursor < end:
            out.append((cursor, end))
    return out


def overlap_s(interval: Interval, merged: Sequence[Interval]) -> float:
    """Seconds of ``interval`` covered by the already merged ``merged`` intervals."""
    start, end = interval
    total = 0.0
    for a, b in merged:
        if b <= start:
            continue
        if a >= end:
            break
        total += min(b, end) - max(a, start)
    return total


def exposed_s(interval: Interval, compute: Sequence[Interval]) -> float:
    """Exposed time of one collective: the part of its interval with no compute running.

    ``compute`` holds the rank's compute intervals in the collective's clock. The result
    lies in [0, end - start] by construction, so exposed never exceeds total.
    """
    start, end = interval
    total = max(0.0, end - start)
    covered = overlap_s((start, end), merge_intervals(compute))
    return min(total, max(0.0, total - covered))
