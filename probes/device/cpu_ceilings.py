"""CPU ceilings per dtype, and a cache that keeps the best of several measurements.

``measure_cpu_ceilings`` adds to the fp32 matmul peak and copy bandwidth of
``microbench.measure_cpu`` the matmul peaks of fp64, bf16 and fp16, so MFU of
float64 or low-precision work is taken against its own peak (issue 21, item 13).
Each is a square matmul timed with ``time.perf_counter`` (best of a few), FLOP/s
= 2 n^3 / time, growing n from 256 until one matmul takes at least ``TARGET_S``
(bf16 runs about a hundred times slower than fp32 on CPUs without AMX, so a
fixed large n would take seconds). Inputs are filled deterministically:
no global random generator is touched.

A figure measured while other processes share the cores is low, and a cache that
keeps the first figure keeps it low for good (24 GFLOP/s instead of 48 on one
machine). ``cached_best`` therefore measures on each of the first ``SAMPLES``
runs, keeping the best value per ceiling, and afterwards re-measures whenever a
quick fp32 check beats the cached peak by more than ``IMPLAUSIBLE``.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from advisor.probes.device import microbench
from advisor.probes.device.microbench import Measured

TARGET_S = 0.04  # one timed matmul should take at least this long: 2.5 scheduler stalls (16 ms)
MAX_N = 1024
REPEATS = 3
FP32_REPEATS = 5  # fp32's peak is every roofline's: the best of more calls
SAMPLES = 3  # runs that measure before the cached best is trusted
IMPLAUSIBLE = 0.25  # a quick check this much above the cached peak: the cache was measured under load
LOW_PRECISION: dict[str, torch.dtype] = {"fp64": torch.float64, "bf16": torch.bfloat16, "fp16": torch.float16}


def _filled(n: int, dtype: torch.dtype) -> torch.Tensor:
    # Values in [-1, 1) with no pattern a kernel could skip; no random generator involved.
    return (torch.arange(n * n, dtype=torch.float32).remainder_(17.0).sub_(8.0).div_(8.0)).view(n, n).to(dtype)


def matmul_flops(dtype: torch.dtype, *, target_s: float = TARGET_S, start_n: int = 256,
                 max_n: int = MAX_N, repeats: int = REPEATS) -> float:
    """Matmul FLOP/s on the CPU for ``dtype``: the best rate over sizes from ``start_n`` up to the
    first whose best-of-``repeats`` time reaches ``target_s`` (or ``max_n``). On cores shared with
    other processes a thread pool stalls a call for a scheduler slice (about 16 ms on a loaded
    2-core machine, whatever the size), so a size is only trusted once its matmul takes longer
    than that. Each next size is the one the last rate says takes ``target_s`` (n^3 work, in
    multiples of 64), and only the first size has an untimed warm-up call: fp16 without native
    kernels runs at 3 GFLOP/s against fp32's 120 on one core, and doubling from 256 to 512 with a
    warm-up at each took it 0.43 s against 0.2."""
    n, rate = start_n, 0.0
    warm = False
    while True:
        a, b = _filled(n, dtype), _filled(n, dtype)
        out = torch.empty(n, n, dtype=dtype)
        if not warm:
            torch.mm(a, b, out=out)  # warm-up: thread pool, packing buffers
            warm = True
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            best = min(best, time.perf_counter() - t0)
        rate = max(rate, 2 * n**3 / best)
        if best >= target_s or n >= max_n:
            return rate
        n = min(max_n, max(n + 64, _size_for(target_s, 2 * n**3 / best)))


def _size_for(seconds: float, flops: float) -> int:
    """The square matmul size (a multiple of 64) that takes about ``seconds`` at ``flops``."""
    return int(round((seconds * flops / 2) ** (1 / 3) / 64)) * 64


def measure_cpu_ceilings() -> Measured:
    """fp32 peak and copy bandwidth (``microbench.measure_cpu``) plus fp64, bf16, fp16 peaks."""
    base = microbench.measure_cpu(n=0)  # copy bandwidth only: fp32's peak is measured below
    peaks = dict(base.peak_flops)
    # The quick check (``quick_fp32_flops``) runs this same kernel: the cached figure must not lose
    # to it merely because it was measured differently.
    peaks["fp32"] = max(peaks.get("fp32", 0.0), matmul_flops(torch.float32, repeats=FP32_REPEATS))
    for key, dtype in LOW_PRECISION.items():
        try:
            peaks[key] = matmul_flops(dtype, max_n=512)
        except RuntimeError:  # a dtype this CPU build has no matmul kernel for
            continue
    return Measured(peak_flops=peaks, memory_bandwidth=base.memory_bandwidth)


def quick_fp32_flops() -> float:
    """A cheap fp32 matmul figure (a few milliseconds), an under-estimate of the peak."""
    return matmul_flops(torch.float32, start_n=256, max_n=512, repeats=3)


def best_of(a: Measured, b: Measured) -> Measured:
    """The higher figure of each ceiling: contention only ever lowers a measurement."""
    keys = set(a.peak_flops) | set(b.peak_flops)
    peaks = {k: max(a.peak_flops.get(k, 0.0), b.peak_flops.get(k, 0.0)) for k in keys}
    bandwidths = [x for x in (a.memory_bandwidth, b.memory_bandwidth) if x is not None]
    return Measured(peak_flops=peaks, memory_bandwidth=max(bandwidths) if bandwidths else None)


def cached_best(key: str, measure: Callable[[], Measured], *,
                check: Callable[[], float] | None = None, samples: int | None = None) -> Measured:
    """``measure()`` on each of the first ``samples`` (default ``SAMPLES``) calls per ``key``,
    keeping the best of each ceiling in ``$ADVISOR_HOME/device_cache.json``; after that the
    cached best, unless ``check()`` (fp32 FLOP/s; default ``quick_fp32_flops``) beats its fp32
    peak by more than ``IMPLAUSIBLE``."""
    samples = SAMPLES if samples is None else samples
    check = quick_fp32_flops if check is None else check
    hit = microbench.DEVICE_CACHE.get(key)
    cached: Measured | None = None
    count = 0
    if isinstance(hit, dict):
        cached = Measured(peak_flops={k: float(v) for k, v in (hit.get("peak_flops") or {}).items()},
                          memory_bandwidth=hit.get("memory_bandwidth"))
        count = int(hit.get("samples") or 1)
        if count >= samples:
            fp32 = cached.peak_flops.get("fp32")
            if not fp32 or check() <= fp32 * (1 + IMPLAUSIBLE):
                return cached
    result = measure()
    if cached is not None:
        result = best_of(cached, result)
    microbench.DEVICE_CACHE.put(key, {"peak_flops": result.peak_flops, "memory_bandwidth": result.memory_bandwidth,
                                      "samples": count + 1})
    return result
