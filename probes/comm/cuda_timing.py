"""NCCL kernel times and compute overlap on CUDA, from ``torch.profiler`` on deep steps.

On CUDA a collective's host-side future completes when its kernel is enqueued, so host
stamps say nothing about the transfer. On deep-sampled steps the probe runs
``torch.profiler.profile(activities=[CPU, CUDA])`` and reads each NCCL kernel's device
interval (``FunctionEvent.time_range``, microseconds); the kernels that are not NCCL are
the compute the collective may overlap. Light steps reuse the latest kernel time measured
for the same (op, bytes, group size, dtype): a cheap per-step estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from advisor.records.intervals import exposed_s, merge_intervals


@dataclass(frozen=True, kw_only=True)
class KernelTime:
    """One NCCL kernel: device time (seconds, from the profiler) and the part not overlapped."""

    name: str
    start_us: float
    time_s: float
    exposed_s: float


def is_nccl_kernel(name: str) -> bool:
    """NCCL's kernels are named ``ncclDevKernel_*`` / ``ncclKernel_*`` (NCCL 2.x)."""
    return name.lower().startswith("nccl")


def kernel_times(events: Iterable[Any]) -> list[KernelTime]:
    """NCCL kernels in start order, with exposure against all other device kernels.

    ``events`` are ``torch.autograd.profiler_util.FunctionEvent`` objects (``prof.events()``);
    only device-side ones (``device_type`` CUDA) are used.
    """
    nccl: list[tuple[str, float, float]] = []
    compute: list[tuple[float, float]] = []
    for evt in events:
        if str(getattr(evt, "device_type", "")).split(".")[-1] != "CUDA":
            continue
        start, end = float(evt.time_range.start), float(evt.time_range.end)
        if is_nccl_kernel(evt.name):
            nccl.append((evt.name, start, end))
        else:
            compute.append((start, end))
    merged = merge_intervals(compute)
    out = []
    for name, start, end in sorted(nccl, key=lambda k: k[1]):
        out.append(
            KernelTime(
                name=name,
                start_us=start,
                time_s=(end - start) * 1e-6,
                exposed_s=exposed_s((start, end), merged) * 1e-6,
            )
        )
    return out
