"""Short micro-benchmarks of a device's ceilings, cached per device and driver.

- Matmul peak per dtype: a square matmul timed after a warm-up; FLOP/s = 2 n^3 / time.
- Bandwidth: a device-to-device copy; bytes/s = (bytes read + bytes written) / time.

The benchmarks draw their operands from private ``torch.Generator`` objects: the
user's script must see the global random streams (CPU, CUDA) exactly as a bare run
would, or its losses would differ on the first run on a machine (empty cache).

On CUDA times come from ``torch.cuda.Event`` pairs; on CPU from ``time.perf_counter``
(best of a few repeats). The CPU run stays well under 2 s (fp32 only: bf16
matmul on CPU is a hundred times slower and not what training uses there).
Results are cached in ``$ADVISOR_HOME/device_cache.json`` (default
``~/.cache/advisor``), keyed by device name, driver and torch version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from advisor.records.json_cache import JsonCache

CUDA_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16,
                                        "tf32": torch.float32, "fp32": torch.float32}


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What the micro-benchmarks measured: FLOP/s per dtype key and copy bytes/s."""

    peak_flops: dict[str, float] = field(default_factory=dict)
    memory_bandwidth: float | None = None


DEVICE_CACHE = JsonCache("device_cache.json")


def cache_path() -> Path:
    return DEVICE_CACHE.path


def cached_measure(key: str, measure: Callable[[], Measured] | None) -> Measured | None:
    """``measure()`` once per ``key``; later calls read the JSON cache. ``measure`` None: the
    cached figures or None, measuring nothing."""
    hit = DEVICE_CACHE.get(key)
    if isinstance(hit, dict):
        return Measured(peak_flops={k: float(v) for k, v in hit.get("peak_flops", {}).items()},
                        memory_bandwidth=hit.get("memory_bandwidth"))
    if measure is None:
        return None
    result = measure()
    DEVICE_CACHE.put(key, {"peak_flops": result.peak_flops, "memory_bandwidth": result.memory_bandwidth})
    return result


def _best_cpu(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (thread pool, page faults)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_cpu(*, n: int = 1024, copy_bytes: int = 64 * 2**20) -> Measured:
    """CPU fp32 matmul FLOP/s (n x n; none for ``n=0``) and copy bandwidth (bytes read + written
    per second)."""
    peaks: dict[str, float] = {}
    if n:
        gen = torch.Generator().manual_seed(0)  # private: the global CPU stream stays untouched
        a = torch.randn(n, n, generator=gen)
        b = torch.randn(n, n, generator=gen)
        out = torch.empty(n, n)
        peaks["fp32"] = 2 * n**3 / _best_cpu(lambda: torch.mm(a, b, out=out), repeats=5)
    src = torch.empty(copy_bytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    t_copy = _best_cpu(lambda: dst.copy_(src), repeats=5)
    return Measured(peak_flops=peaks, memory_bandwidth=2 * copy_bytes / t_copy)


def _cuda_time(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Seconds per call of ``fn`` from CUDA events after a warm-up."""
    for _ in range(3):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def measure_cuda(device: torch.device, *, n: int = 8192, copy_bytes: int = 2**30) -> Measured:
    """CUDA matmul FLOP/s for bf16, fp16, tf32, fp32 and device copy bytes/s."""
    peaks: dict[str, float] = {}
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        with torch.cuda.device(device):
            gen = torch.Generator(device=device).manual_seed(0)  # private: see the module docstring
            for key, dtype in CUDA_DTYPES.items():
                torch.backends.cuda.matmul.allow_tf32 = key == "tf32"
                a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
                b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
                iters = 20 if dtype in (torch.bfloat16, torch.float16) else 5
                peaks[key] = 2 * n**3 / _cuda_time(lambda: torch.mm(a, b), device, iters)
                del a, b
            src = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            t_copy = _cuda_time(lambda: dst.copy_(src), device, 20)
            del src, dst
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
        # Our buffers (2 GiB of copy source and target, the matrices) would otherwise stay in
        # the caching allocator's reserve and read as the job's own unused cache: measured on
        # an H100, 3.1 GiB of "reserve no tensor uses" and an expandable-segments advice.
        torch.cuda.empty_cache()
    return Measured(peak_flops=peaks, memory_bandwidth=2 * copy_bytes / t_copy)
