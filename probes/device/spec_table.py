"""Dense peak figures from vendor datasheets (REFERENCE.md), matched by device name.

FLOP/s are dense (no sparsity), bandwidth is bytes/s of device memory,
capacity is bytes. Only parts whose datasheets we are sure of are listed. fp64 is the
FP64 Tensor Core figure where the part has one (what a float64 matmul runs at); parts
with a throttled fp64 unit (A10, L4, T4) list none rather than a guess: MFU of float64
work there is unknown, never taken against another dtype's peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

T = 1e12
GB = 10**9


@dataclass(frozen=True, kw_only=True)
class PartSpec:
    """Datasheet ceilings of one GPU part."""

    name: str
    match: tuple[str, ...]  # all of these substrings (upper case) must be in the device name
    peak_flops: dict[str, float] = field(default_factory=dict)  # dtype key -> FLOP/s
    memory_bandwidth: float  # bytes/s
    memory_capacity: int  # bytes


# More specific entries first: the first match wins.
PARTS: tuple[PartSpec, ...] = (
    PartSpec(name="H100 PCIe", match=("H100", "PCIE"), memory_bandwidth=2.0e12, memory_capacity=80 * GB,
             peak_flops={"fp8": 1513 * T, "bf16": 756 * T, "fp16": 756 * T, "tf32": 378 * T, "fp32": 51 * T, "fp64": 51 * T}),
    PartSpec(name="H100 SXM", match=("H100",), memory_bandwidth=3.35e12, memory_capacity=80 * GB,
             peak_flops={"fp8": 1979 * T, "bf16": 989 * T, "fp16": 989 * T, "tf32": 495 * T, "fp32": 67 * T, "fp64": 67 * T}),
    PartSpec(name="H200 SXM", match=("H200",), memory_bandwidth=4.8e12, memory_capacity=141 * GB,
             peak_flops={"fp8": 1979 * T, "bf16": 989 * T, "fp16": 989 * T, "tf32": 495 * T, "fp32": 67 * T,
                         "fp64": 67 * T}),
    PartSpec(name="A100 80GB PCIe", match=("A100", "80GB", "PCIE"), memory_bandwidth=1.935e12,
             memory_capacity=80 * GB,
             peak_flops={"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T, "fp64": 19.5 * T}),
    PartSpec(name="A100 SXM 80GB", match=("A100", "80GB"), memory_bandwidth=2.039e12, memory_capacity=80 * GB,
             peak_flops={"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T, "fp64": 19.5 * T}),
    PartSpec(name="A100 40GB", match=("A100",), memory_bandwidth=1.555e12, memory_capacity=40 * GB,
             peak_flops={"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T, "fp64": 19.5 * T}),
    PartSpec(name="A10", match=("A10",), memory_bandwidth=600 * GB, memory_capacity=24 * GB,
             peak_flops={"bf16": 125 * T, "fp16": 125 * T, "tf32": 62.5 * T, "fp32": 31.2 * T}),
    PartSpec(name="L4", match=("L4",), memory_bandwidth=300 * GB, memory_capacity=24 * GB,
             peak_flops={"fp8": 242 * T, "bf16": 121 * T, "fp16": 121 * T, "tf32": 60 * T, "fp32": 30 * T}),
    # V100 and T4 have fp16 tensor cores but no bf16 or tf32.
    PartSpec(name="V100", match=("V100",), memory_bandwidth=900 * GB, memory_capacity=32 * GB,
             peak_flops={"fp16": 125 * T, "fp32": 15.7 * T, "fp64": 7.8 * T}),
    PartSpec(name="T4", match=("T4",), memory_bandwidth=320 * GB, memory_capacity=16 * GB,
             peak_flops={"fp16": 65 * T, "fp32": 8.1 * T}),
)


def lookup(device_name: str) -> PartSpec | None:
    """The datasheet entry for a device name such as "NVIDIA H100 80GB HBM3", or None."""
    upper = device_name.upper().replace("-", " ")
    compact = upper.replace(" ", "")
    for part in PARTS:
        if all(m in upper or m in compact for m in part.match):
            if part.match == ("A10",) and ("A100" in compact or "A10G" in compact):
                continue  # "A10" is a prefix of A100 and the (unlisted) A10G
            if part.match == ("L4",) and "L40" in compact:
                continue  # L40/L40S are different parts
            return part
    return None
