"""DeviceSpec: the ceilings the roofline uses, and how they were found.

Sources, per value: the datasheet table (spec_table), the micro-benchmarks
(microbench) and the user's overrides (``--peak-flops``, ``--peak-bandwidth``).
On a GPU both spec and measured are kept; the measured value is used where it
differs from the datasheet by more than ``DISAGREE`` (a throttled or
misidentified part). On a CPU only measurements exist: fp32, fp64, bf16 and fp16
matmul peaks and copy bandwidth (cpu_ceilings), the best of several runs.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch.utils._python_dispatch import _disable_current_modes

from advisor.probes.device import cpu_ceilings, microbench, nvml, spec_table

DISAGREE = 0.25  # relative difference beyond which the measured ceiling wins

SOURCES: tuple[str, ...] = ("spec", "measured", "override")


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """Ceilings of one device. FLOP/s per dtype key ("fp64", "fp32", "tf32", "bf16", "fp16",
    "fp8"; an op is judged against the peak of its own dtype), bandwidth in bytes/s, capacity
    in bytes."""

    type: str  # "cpu" | "cuda"
    name: str
    index: int | None = None
    driver: str | None = None
    peak_flops: dict[str, float] = field(default_factory=dict)  # the values in use
    memory_bandwidth: float | None = None
    memory_capacity: int | None = None
    source: str = "spec"  # where the values in use came from: SOURCES
    part: str | None = None  # the spec-table entry matched
    spec_peak_flops: dict[str, float] = field(default_factory=dict)
    spec_memory_bandwidth: float | None = None
    measured_peak_flops: dict[str, float] = field(default_factory=dict)
    measured_memory_bandwidth: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return spec_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DeviceSpec":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


def spec_to_dict(spec: DeviceSpec) -> dict[str, Any]:
    """Plain JSON types, for ``Event(name="device_spec", data=...)``."""
    return {name: (dict(v) if isinstance(v, dict) else v)
            for name, v in ((f, getattr(spec, f)) for f in spec.__dataclass_fields__)}


def _choose(spec: float | None, measured: float | None) -> tuple[float | None, bool]:
    """(value, whether the measurement was used)."""
    if spec is None:
        return measured, measured is not None
    if measured is not None and abs(measured / spec - 1.0) > DISAGREE:
        return measured, True
    return spec, False


def combine(*, type: str, name: str, part: spec_table.PartSpec | None, measured: microbench.Measured | None,
            peak_flops: float | None = None, peak_bandwidth: float | None = None,
            memory_capacity: int | None = None, index: int | None = None,
            driver: str | None = None) -> DeviceSpec:
    """Merge datasheet, measurement and overrides into one DeviceSpec (pure)."""
    spec_flops = dict(part.peak_flops) if part else {}
    meas_flops = dict(measured.peak_flops) if measured else {}
    used_measured = False
    flops: dict[str, float] = {}
    for key in sorted(set(spec_flops) | set(meas_flops)):
        value, from_meas = _choose(spec_flops.get(key), meas_flops.get(key))
        if value is not None:
            flops[key] = value
            used_measured |= from_meas
    bandwidth, from_meas = _choose(part.memory_bandwidth if part else None,
                                   measured.memory_bandwidth if measured else None)
    used_measured |= from_meas
    source = "measured" if used_measured else "spec"
    if peak_flops is not None:
        if peak_flops <= 0:
            raise ValueError(f"--peak-flops must be a positive FLOP/s figure, got {peak_flops}")
        # One figure from the user: it replaces the peak of every dtype.
        flops = {key: float(peak_flops) for key in (flops or {"fp32": 0.0})}
        source = "override"
    if peak_bandwidth is not None:
        if peak_bandwidth <= 0:
            raise ValueError(f"--peak-bandwidth must be a positive bytes/s figure, got {peak_bandwidth}")
        bandwidth = float(peak_bandwidth)
        source = "override"
    capacity = memory_capacity if memory_capacity is not None else (part.memory_capacity if part else None)
    return DeviceSpec(type=type, name=name, index=index, driver=driver, peak_flops=flops,
                      memory_bandwidth=bandwidth, memory_capacity=capacity, source=source,
                      part=part.name if part else None, spec_peak_flops=spec_flops,
                      spec_memory_bandwidth=part.memory_bandwidth if part else None,
                      measured_peak_flops=meas_flops,
                      measured_memory_bandwidth=measured.memory_bandwidth if measured else None)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _cpu_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def detect_device_spec(device: torch.device | str, *, peak_flops: float | None = None,
                       peak_bandwidth: float | None = None, measure: bool = True,
                       cached_only: bool = False) -> DeviceSpec:
    """Ceilings of ``device`` ("cpu" or "cuda[:i]"): spec table, micro-benchmarks, overrides.
    ``cached_only``: a CUDA device's figures come from the cache when it has them, and are not
    measured when it does not (the benchmarks take 2.3 GiB of device memory: under an enforced
    budget they ran the job's allocator out and left it fragmented).

    The micro-benchmarks are the advisor's own work: they run outside every dispatch mode in
    force (the memory tracker, and the budget it enforces under ``--enforce-budget``), so their
    allocations are neither counted in the script's step nor able to raise its out-of-memory
    error. (``_disable_current_modes`` is private, but the only way to step outside a mode the
    caller did not enter; it has been stable since torch 2.0.)
    """
    with _disable_current_modes():
        return _detect(torch.device(device), peak_flops=peak_flops, peak_bandwidth=peak_bandwidth,
                       measure=measure, cached_only=cached_only)


def _detect(device: torch.device, *, peak_flops: float | None, peak_bandwidth: float | None,
            measure: bool, cached_only: bool = False) -> DeviceSpec:
    if device.type == "cpu":
        name = cpu_name()
        threads = torch.get_num_threads()
        measured = None
        if measure:
            key = f"cpu|{name}|threads={threads}|torch={torch.__version__}"
            # Best of several runs, re-measured when a quick check says the cache is low: a
            # figure taken while other processes shared the cores must not stay (cpu_ceilings).
            measured = cpu_ceilings.cached_best(key, cpu_ceilings.measure_cpu_ceilings)
        return combine(type="cpu", name=f"{name} ({threads} threads)", part=None, measured=measured,
                       peak_flops=peak_flops, peak_bandwidth=peak_bandwidth, memory_capacity=_cpu_memory())
    if device.type != "cuda":
        raise ValueError(f"unsupported device type {device.type!r}; valid: 'cpu', 'cuda'")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device} requested but CUDA is not available")
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    reader = nvml.default()
    uuid_text = f"GPU-{uuid}" if uuid is not None else None
    name = reader.device_name(index, uuid_text) or torch.cuda.get_device_name(index)
    driver = reader.driver_version()
    capacity = reader.memory_total(index, uuid_text) or int(props.total_memory)
    measured = None
    if measure:
        key = f"cuda|{name}|driver={driver}|torch={torch.__version__}"
        dev = torch.device("cuda", index)
        measured = microbench.cached_measure(key, None if cached_only else lambda: microbench.measure_cuda(dev))
    return combine(type="cuda", name=name, part=spec_table.lookup(name), measured=measured,
                   peak_flops=peak_flops, peak_bandwidth=peak_bandwidth, memory_capacity=capacity,
                   index=index, driver=driver)
