"""Which steps the agent samples how, for the agent and the controller alike (torch-free).

Deep steps (``deep_steps``, default 1-3) run the probes; one light step in
``LIGHT_TIMING_EVERY`` (due at steps 4, 9, 14, ..., backing off as a run grows: ``light_timing_due``)
times the numbered modules' forward (``advisor/agent/block_timer.py``), or the first light step
after it that follows a light step (``light_timing_now``: step 5 after the default deep steps). The controller's apply waits for the first of those after the
deep steps when the step asked for leaves room (``advisor/advice.py``).
"""

from __future__ import annotations

from typing import Iterable

DEEP_STEPS = (1, 2, 3)
LIGHT_TIMING_EVERY = 5
# Periodic deep steps back off: ten at the period asked for, then ten at twice it, and so on up to
# DEEP_PERIOD_CAP times it. A deep step costs a few light steps and tens of kilobytes to hundreds
# of store records; at every 100th step for good, a million-step run held 10,000 of them.
DEEP_PER_PERIOD = 10
DEEP_PERIOD_CAP = 64
# Block timing backs off the same way, up to LIGHT_TIMING_CAP times its period: a timed step costs
# 1.5-2.5% more than another (its saved-tensor hooks and clock reads; the 20 ms MLP of
# bench/overhead.py), which one step in five made 0.3-0.5% of every step for good. The figures are
# medians over the timed steps: ten at the start settle them, and later ones keep them current.
LIGHT_TIMING_PER_PERIOD = 10
LIGHT_TIMING_CAP = 16
# Light memory samples: every light step's until step 2 * LIGHT_SAMPLES_FULL, then one per bucket
# of light steps, a bucket twice as long each time the run doubles (the sample of largest total kept).
LIGHT_SAMPLES_FULL = 10_000


def backoff_due(n: int, every: int, *, per_period: int, cap: int) -> bool:
    """Whether ``n`` (> 0) is due on a schedule that backs off: every ``every``-th for the first
    ``per_period``, then the period doubles after each ``per_period`` more, up to ``cap`` times ``every``."""
    if every <= 0 or n <= 0:
        return False
    start, period = 0, every
    while period < every * cap:
        end = start + per_period * period
        if n <= end:
            break
        start, period = end, period * 2
    return (n - start) % period == 0


def periodic_deep_due(step: int, every: int) -> bool:
    """Whether ``step`` is a periodic deep step (``--deep-every``): every ``every``-th step for the
    first ``DEEP_PER_PERIOD`` of them, then the period doubles after each ``DEEP_PER_PERIOD`` more,
    up to ``DEEP_PERIOD_CAP`` times ``every``. With 100: 100, 200, ... 1000, 1200, ... 3000, 3400, ..."""
    return backoff_due(step, every, per_period=DEEP_PER_PERIOD, cap=DEEP_PERIOD_CAP)


def light_sample_bucket(step: int, full: int = LIGHT_SAMPLES_FULL) -> tuple[int, int]:
    """(bucket id, bucket length in steps) of light step ``step``'s memory sample: length 1 before
    ``full``, then 2**k from ``full * 2**k`` on; buckets never straddle those steps."""
    if step < 2 * full or full <= 0:
        return step, 1
    size = 1 << ((step // full).bit_length() - 1)
    return step // size, size


def light_timing_due(step: int, every: int = LIGHT_TIMING_EVERY) -> bool:
    """Whether ``step`` (when light) times its numbered modules' forward: steps every-1, 2*every-1,
    ... for ``LIGHT_TIMING_PER_PERIOD`` of them, then backing off up to ``LIGHT_TIMING_CAP`` times
    ``every`` (``backoff_due``). With 5: 4, 9, ..., 49, 59, ..., 149, 169, ..., 349, 389, ...;
    every 80th step from step 749 on."""
    return backoff_due(step + 1, every, per_period=LIGHT_TIMING_PER_PERIOD, cap=LIGHT_TIMING_CAP)


def light_timing_now(step: int, *, owed: bool, after_deep: bool,
                     every: int = LIGHT_TIMING_EVERY) -> tuple[bool, bool]:
    """(whether light step ``step`` times its blocks, whether a timing is still owed after it).

    A due step right after a deep one (``after_deep``) passes its timing on to the next light step
    that follows a light one: the step after deep ones pays for their teardown while the
    controller digests their records, on 2 cores 1.3-3x an ordinary step (hf_clm 8.3 ms beside
    5.5, the zoo's FSDP2 549 ms beside 190), and blocks timed there priced checkpointing's
    recompute up to 3x what it cost."""
    owed = owed or light_timing_due(step, every)
    if owed and not after_deep:
        return True, False
    return False, owed


def first_timed_light_step(deep_steps: Iterable[int], every: int = LIGHT_TIMING_EVERY,
                           horizon: int = 1000) -> int | None:
    """The first step after the first deep step that is light and block-timed, or None."""
    deep = set(deep_steps)
    if not deep or every <= 0:
        return None
    owed = False
    for k in range(min(deep) + 1, min(deep) + horizon):
        if k in deep:
            continue
        timed, owed = light_timing_now(k, owed=owed, after_deep=k - 1 in deep, every=every)
        if timed:
            return k
    return None
