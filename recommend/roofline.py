"""Roofline verdicts for ops and steps (pure: no torch).

Per op: intensity I = FLOPs / bytes; the roof at that intensity is
min(peak[dtype], I * bandwidth); achieved FLOP/s = FLOPs / time; roof fraction =
achieved / roof; the op is memory bound when I is below the ridge of its dtype,
ridge = peak[dtype] / bandwidth (REFERENCE.md, Roofline).

Per step: achieved FLOP/s = FLOPs / step time; MFU = useful FLOPs per step /
step time / peak of the dominant dtype (the dtype carrying most FLOPs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, Mapping

# torch dtype names (as OpStat.dtype holds them) -> the DeviceSpec's peak keys.
_DTYPE_KEYS: dict[str, str] = {
    "float32": "fp32", "float": "fp32", "float64": "fp64", "double": "fp64",
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    **{k: k for k in ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")},
}


@functools.lru_cache(maxsize=256)  # called per op signature (30,000 at 5001 modules), over a handful of names
def dtype_key(dtype: str) -> str:
    """``"torch.bfloat16"`` or ``"bfloat16"`` -> ``"bf16"``; float8 types -> ``"fp8"``;
    integer and bool types -> ``"fp32"`` (their ops run on the general-purpose units)."""
    name = dtype.removeprefix("torch.")
    if name.startswith("float8"):
        return "fp8"
    if name in _DTYPE_KEYS:
        return _DTYPE_KEYS[name]
    return "fp32"


def peak_for(dtype: str, peak_flops: Mapping[str, float]) -> float | None:
    """Peak FLOP/s for an op dtype: its own key, else fp32, else the largest listed."""
    key = dtype_key(dtype)
    if key in peak_flops:
        return float(peak_flops[key])
    if "fp32" in peak_flops:
        return float(peak_flops["fp32"])
    return max(peak_flops.values()) if peak_flops else None


@dataclass(frozen=True, kw_only=True)
class OpVerdict:
    """Where one op sits against the roofline. FLOP/s, bytes/s, FLOPs/byte; None when unknown."""

    intensity: float | None
    ridge: float | None
    roof_flops_per_s: float | None
    achieved_flops_per_s: float | None
    roof_fraction: float | None
    bound: str | None  # "memory" | "compute"


def op_verdict(*, flops: float, bytes: float, time_s: float, dtype: str,
               peak_flops: Mapping[str, float], bandwidth: float | None) -> OpVerdict:
    """Roofline verdict of one op (or one aggregated op signature)."""
    intensity = flops / bytes if bytes > 0 else None
    peak = peak_for(dtype, peak_flops)
    ridge = peak / bandwidth if peak is not None and bandwidth else None
    roof = None
    if peak is not None and intensity is not None and bandwidth:
        roof = min(peak, intensity * bandwidth)
    achieved = flops / time_s if time_s > 0 else None
    fraction = achieved / roof if achieved is not None and roof else None
    bound = None
    if intensity is not None and ridge is not None:
        bound = "memory" if intensity < ridge else "compute"
    return OpVerdict(intensity=intensity, ridge=ridge, roof_flops_per_s=roof,
                     achieved_flops_per_s=achieved, roof_fraction=fraction, bound=bound)


@dataclass(frozen=True, kw_only=True)
class OpFigures:
    """The inputs of a step summary for one op: FLOPs, bytes, seconds, dtype name."""

    flops: float
    bytes: float
    time_s: float
    dtype: str


@dataclass(frozen=True, kw_only=True)
class StepSummary:
    """A step against the roofline. Shares are fractions of the step time."""

    flops: float
    op_time_s: float
    step_time_s: float
    achieved_flops_per_s: float | None
    dominant_dtype: str | None  # peak key carrying the most FLOPs
    mfu: float | None
    memory_bound_share: float | None
    unaccounted_share: float | None


def dominant_dtype(ops: Iterable[OpFigures]) -> str | None:
    """The peak key ("bf16", "fp32", ...) with the most FLOPs."""
    totals: dict[str, float] = {}
    for op in ops:
        if op.flops > 0:
            key = dtype_key(op.dtype)
            totals[key] = totals.get(key, 0.0) + op.flops
    return max(totals, key=totals.__getitem__) if totals else None


def step_summary(ops: list[OpFigures], *, step_time_s: float, peak_flops: Mapping[str, float],
                 bandwidth: float | None, mfu_step_time_s: float | None = None) -> StepSummary:
    """Summarise one step's ops. ``step_time_s`` is the time the ops ran in (for the shares);
    ``mfu_step_time_s`` the undisturbed step time for MFU and achieved FLOP/s (defaults to it)."""
    flops = sum(op.flops for op in ops)
    op_time = sum(op.time_s for op in ops)
    mfu_time = mfu_step_time_s if mfu_step_time_s else step_time_s
    achieved = flops / mfu_time if mfu_time > 0 else None
    dominant = dominant_dtype(ops)
    peak = peak_for(dominant, peak_flops) if dominant else None
    mfu = achieved / peak if achieved is not None and peak else None
    memory_share = unaccounted = None
    if step_time_s > 0:
        memory_time = sum(op.time_s for op in ops
                          if op_verdict(flops=op.flops, bytes=op.bytes, time_s=op.time_s, dtype=op.dtype,
                                        peak_flops=peak_flops, bandwidth=bandwidth).bound == "memory")
        memory_share = memory_time / step_time_s if peak_flops and bandwidth else None
        unaccounted = max(0.0, 1.0 - op_time / step_time_s)
    return StepSummary(flops=flops, op_time_s=op_time, step_time_s=step_time_s, achieved_flops_per_s=achieved,
                       dominant_dtype=dominant, mfu=mfu, memory_bound_share=memory_share,
                       unaccounted_share=unaccounted)
