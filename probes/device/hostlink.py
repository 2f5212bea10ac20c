"""Host-link bandwidth: pinned host<->device copy speed, measured once per device and driver.

The offload remedies' cost model (``recommend/remedies/offload.py``) divides bytes by this
figure. On CUDA: ``copy_(non_blocking=True)`` between a pinned host buffer and a device buffer,
timed with CUDA events (bytes / seconds, best of a few repeats, each direction). On a CPU-only
build there is no link (``pin_memory`` raises): the figure is a same-device copy and
``host_link_source`` says so. Cached in ``$ADVISOR_HOME/hostlink_cache.json`` (default
``~/.cache/advisor``) keyed like the other device ceilings (device name, driver, torch version).
``--host-link-bandwidth`` (``AgentSettings.host_link_bandwidth``, bytes/s) overrides the measurement.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from advisor.records.json_cache import JsonCache

COPY_BYTES = 256 << 20  # large enough to reach the link's plateau on PCIe and C2C alike
REPEATS = 5


HOSTLINK_CACHE = JsonCache("hostlink_cache.json")


def cache_path() -> Path:
    return HOSTLINK_CACHE.path


def _best(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_cpu(nbytes: int = 64 << 20) -> dict[str, float]:
    """Same-device copy bytes/s (source: ``Tensor.copy_`` timed with ``time.perf_counter``)."""
    src = torch.empty(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    rate = nbytes / _best(lambda: dst.copy_(src), REPEATS)
    return {"host_to_device_bandwidth": rate, "device_to_host_bandwidth": rate}


def measure_cuda(device: torch.device, nbytes: int = COPY_BYTES) -> dict[str, float]:
    """Pinned copies each way, bytes/s (source: CUDA events around ``copy_(non_blocking=True)``)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for key, dst, src in (("host_to_device_bandwidth", dev, host), ("device_to_host_bandwidth", host, dev)):
        dst.copy_(src, non_blocking=True)  # warm up
        best = float("inf")
        for _ in range(REPEATS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        out[key] = nbytes / best
    # The loop's names hold the buffers too: without them in the del, the device buffer
    # outlived empty_cache and stayed in the job's reserve (an H200 read 64 MiB more after it).
    del host, dev, dst, src
    torch.cuda.empty_cache()  # our 256 MiB must not stay in the job's reserve (see microbench.measure_cuda)
    return out


def host_link(device: torch.device | str, *, override: float | None = None, measure: bool = True,
              cached_only: bool = False) -> dict[str, Any]:
    """Fields added to the ``device_spec`` event: ``host_link_bandwidth`` (bytes/s, the slower
    direction, the one the cost model uses), each direction, and ``host_link_source``
    ("override", "measured", "same-device copy (no host link on a CPU-only device)" or None)."""
    device = torch.device(device)
    if override is not None:
        if override <= 0:
            raise ValueError(f"host_link_bandwidth must be a positive bytes/s figure, got {override}")
        return {"host_link_bandwidth": float(override), "host_link_source": "override"}
    if not measure:
        return {"host_link_bandwidth": None, "host_link_source": None}
    cuda = device.type == "cuda" and torch.cuda.is_available()
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    key = f"{device.type}|{name}|driver={torch.version.cuda if cuda else None}|torch={torch.__version__}"
    rates = HOSTLINK_CACHE.get(key)
    if not isinstance(rates, dict) and cached_only and cuda:
        return {"host_link_bandwidth": None, "host_link_source": None}  # see detect_device_spec
    if not isinstance(rates, dict):
        rates = measure_cuda(device) if cuda else measure_cpu()
        HOSTLINK_CACHE.put(key, rates)
    return {**rates, "host_link_bandwidth": min(rates.values()),
            "host_link_source": "measured" if cuda else "same-device copy (no host link on a CPU-only device)"}
