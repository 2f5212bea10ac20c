"""Compute-bound rule: fp32 matmul/conv time dominates and runs near the fp32 roof, on a device
with tensor cores; it proposes TF32 matmuls and bf16 autocast.

Evidence (``Profile.ops``, ``Profile.device``): the fp32 ops of ``MATMUL_OPS`` take more than
``MATMUL_SHARE`` of the step, at a time-weighted ``ROOF_SHARE`` or more of their fp32 roof
(``min(peak_fp32, intensity x bandwidth)``, recommend/roofline.py), and the device lists a tf32
or bf16 peak at least ``TENSOR_CORE_GAIN`` times its fp32 peak.

Prediction: each affected op keeps its achieved share of the roof, at the faster roof:
``t' = t x roof_fp32 / roof_new``. TF32 keeps the bytes (roof ``min(peak_tf32, I x bw)``);
bf16 halves them (roof ``min(peak_bf16, 2I x bw)``). The step saves ``sum(t - t')`` per step.
The remedies (``recommend/remedies/tf32_matmul.py``, ``autocast_bf16.py``) propose through
``lower_precision``.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.rules._figures import FP32_DTYPES, matmul_ops, ms, steps_covered
from advisor.records.advice import Evidence, Prediction, Recommendation

NAME = "compute"

MATMUL_SHARE = 0.5  # fp32 matmul time above this share of the step: compute dominates
ROOF_SHARE = 0.5  # achieved / fp32 roof at or above this: the ops are near their ceiling
TENSOR_CORE_GAIN = 2.0  # a tf32/bf16 peak this many times fp32: the device has tensor cores


def _roof(peak: float, intensity: float | None, bandwidth: float | None) -> float:
    return min(peak, intensity * bandwidth) if intensity and bandwidth else peak


def saved_per_step(profile: Profile, key: str, byte_factor: float) -> float:
    """Seconds per step the fp32 matmul ops save at the ``key`` peak with bytes x ``byte_factor``."""
    peaks = profile.device.peak_flops
    bw = profile.device.memory_bandwidth
    fp32, fast = peaks.get("fp32"), peaks.get(key)
    if not fp32 or not fast:
        return 0.0
    ops = [o for o in matmul_ops(profile.ops) if o.dtype in FP32_DTYPES]
    saved = 0.0
    for op in ops:
        intensity = op.flops / op.bytes if op.bytes else None
        new_intensity = intensity / byte_factor if intensity else None
        ratio = _roof(fp32, intensity, bw) / _roof(fast, new_intensity, bw)
        saved += op.time_s * (1.0 - min(1.0, ratio))
    return saved / steps_covered(ops) if ops else 0.0


@dataclass(frozen=True, kw_only=True)
class MatmulFigures:
    """What the compute rule measured: the fp32 matmul/conv ops' share of the step and of their roof."""

    step_s: float
    time_per_step_s: float
    share: float  # of the step
    roof_share: float  # achieved / fp32 roof, time-weighted
    fp32_flops: float
    tensor_core_flops: float

    def lines(self) -> list[str]:
        return [f"fp32 matmul/conv {ms(self.time_per_step_s)} of a {ms(self.step_s)} step ({self.share:.0%})",
                f"{self.roof_share:.0%} of the fp32 roof achieved"]


def matmul_figures(profile: Profile) -> MatmulFigures | None:
    """The fp32 matmul/conv figures on a CUDA device with a tf32 or bf16 peak; None without one."""
    step, device = profile.step_time_s, profile.device
    fp32, bw = device.peak_flops.get("fp32"), device.memory_bandwidth
    ops = [o for o in matmul_ops(profile.ops) if o.dtype in FP32_DTYPES and o.time_s > 0]
    if not step or not fp32 or not ops or device.type != "cuda":
        return None
    time_per_step = sum(o.time_s for o in ops) / steps_covered(ops)
    total_time = sum(o.time_s for o in ops)
    roof_share = sum(o.flops / o.time_s / _roof(fp32, o.flops / o.bytes if o.bytes else None, bw) * o.time_s
                     for o in ops) / total_time
    fast = max(device.peak_flops.get("tf32") or 0.0, device.peak_flops.get("bf16") or 0.0)
    return MatmulFigures(step_s=step, time_per_step_s=time_per_step, share=time_per_step / step,
                         roof_share=roof_share, fp32_flops=fp32, tensor_core_flops=fast)


def compute_rule(profile: Profile) -> Finding | None:
    figures = matmul_figures(profile)
    if figures is None or figures.tensor_core_flops < TENSOR_CORE_GAIN * figures.fp32_flops:
        return None  # no tensor cores: a lower precision would not be faster
    share, roof_share = figures.share, figures.roof_share
    if share <= MATMUL_SHARE or roof_share < ROOF_SHARE:
        return None
    evidence = (
        Evidence(what="fp32 matmul/conv time / step time", value=round(share, 4), threshold=MATMUL_SHARE),
        Evidence(what="achieved / fp32 roof (time-weighted)", value=round(roof_share, 4), threshold=ROOF_SHARE),
        Evidence(what="fp32 matmul/conv time per step", value=round(figures.time_per_step_s, 6), unit="s"),
        Evidence(what="peak FLOP/s fp32 / tensor cores",
                 value=f"{figures.fp32_flops:.3g} / {figures.tensor_core_flops:.3g}", unit="FLOP/s"),
    )
    return Finding(rule=NAME, bottleneck="compute", summary=f"fp32 matmuls take {share:.0%} of the step near their roof",
                   severity=share, evidence=evidence)


def lower_precision(profile: Profile, *, spec_name: str, apply_class: str, key: str, byte_factor: float,
                    title: str, why: str) -> Proposal:
    """The compute rule's remedies, one per faster roof: each fp32 matmul at its achieved share of
    the roof at the ``key`` peak, with its bytes x ``byte_factor``; the peak predicted unchanged
    only where the bytes are (TF32 keeps the fp32 tensors)."""
    figures = matmul_figures(profile)
    if figures is None or not profile.device.peak_flops.get(key):
        return Proposal()
    saved = saved_per_step(profile, key, byte_factor)
    step = figures.step_s
    peak = (measured_peak(profile) or None) if byte_factor == 1.0 else None
    return Proposal(recommendations=(Recommendation(
        id=spec_name.replace("_", "-"), remedy=spec_name,
        title=f"{title}: fp32 matmuls take {figures.share:.0%} of the step",
        params={},
        predicted=Prediction(peak_memory_bytes=peak, step_time_s=step - saved),
        baseline=Prediction(peak_memory_bytes=peak, step_time_s=step),
        budget_bytes=profile.budget_bytes,
        cost_model=f"each fp32 matmul/conv at its achieved roof share, roof at the {key} peak"
                   + (" with half the bytes" if byte_factor != 1.0 else ""),
        confidence="medium", exact=False, live=True, apply_class=apply_class,
        prerequisites=[f"a CUDA device with {key} tensor cores", f"changes numerics: {why}"],
        evidence=figures.lines() + [f"saves {ms(saved)} per step"],
    ),))


RULE = compute_rule
