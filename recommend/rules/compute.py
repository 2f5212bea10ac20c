"""Compute-bound rule: fp32 matmul/conv time dominates and runs near the fp32 roof, on a device
with tensor cores; it proposes TF32 matmuls and bf16 autocast.

Evidence (``Profile.ops``, ``Profile.device``): the fp32 ops of ``MATMUL_OPS`` take more than
``MATMUL_SHARE`` of the step, at a time-weighted ``ROOF_SHARE`` or more of their fp32 roof
(``min(peak_fp32, intensity x bandwidth)``, recommend/roofline.py), and the device lists a tf32
or bf16 peak at least ``TENSOR_CORE_GAIN`` times its fp32 peak.

Prediction: each affected op keeps its achieved share of the roof, at the faster roof:
``t' = t x roof_fp32 / roof_new``. TF32 keeps the bytes (roof ``min(peak_tf32, I x bw)``);
bf16 halves them (roof ``min(peak_bf16, 2I x bw)``). The step saves ``sum(t - t')`` per step.
"""

from __future__ import annotations

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import autocast_bf16, tf32_matmul
from advisor.recommend.rules._figures import FP32_DTYPES, matmul_ops, ms, steps_covered
from advisor.records.advice import Prediction, Recommendation

MATMUL_SHARE = 0.5  # fp32 matmul time above this share of the step: compute dominates
ROOF_SHARE = 0.5  # achieved / fp32 roof at or above this: the ops are near their ceiling
TENSOR_CORE_GAIN = 2.0  # a tf32/bf16 peak this many times fp32: the device has tensor cores


def _roof(peak: float, intensity: float | None, bandwidth: float | None) -> float:
    return min(peak, intensity * bandwidth) if intensity and bandwidth else peak


def saved_per_step(profile: Profile, key: str, byte_factor: float) -> float:
    """Seconds per step the fp32 matmul ops save at the ``key`` peak with bytes x ``byte_factor``."""
    peaks = profile.device.get("peak_flops") or {}
    bw = profile.device.get("memory_bandwidth")
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


def compute_rule(profile: Profile) -> Finding | None:
    step, device = profile.step_time_s, profile.device
    peaks = device.get("peak_flops") or {}
    fp32, bw = peaks.get("fp32"), device.get("memory_bandwidth")
    ops = [o for o in matmul_ops(profile.ops) if o.dtype in FP32_DTYPES and o.time_s > 0]
    if not step or not fp32 or not ops or device.get("type") != "cuda":
        return None
    fast = max(peaks.get("tf32") or 0.0, peaks.get("bf16") or 0.0)
    if fast < TENSOR_CORE_GAIN * fp32:
        return None  # no tensor cores: a lower precision would not be faster
    time_per_step = sum(o.time_s for o in ops) / steps_covered(ops)
    share = time_per_step / step
    total_time = sum(o.time_s for o in ops)
    roof_share = sum(o.flops / o.time_s / _roof(fp32, o.flops / o.bytes if o.bytes else None, bw) * o.time_s
                     for o in ops) / total_time
    if share <= MATMUL_SHARE or roof_share < ROOF_SHARE:
        return None
    evidence = [
        {"what": "fp32 matmul/conv time / step time", "value": round(share, 4), "threshold": MATMUL_SHARE},
        {"what": "achieved / fp32 roof (time-weighted)", "value": round(roof_share, 4), "threshold": ROOF_SHARE},
        {"what": "fp32 matmul/conv time per step", "value": round(time_per_step, 6), "unit": "s"},
        {"what": "peak FLOP/s fp32 / tensor cores", "value": f"{fp32:.3g} / {fast:.3g}", "unit": "FLOP/s"},
    ]
    recs = []
    lines = [f"fp32 matmul/conv {ms(time_per_step)} of a {ms(step)} step ({share:.0%})",
             f"{roof_share:.0%} of the fp32 roof achieved"]
    for spec, key, factor, title, why in (
        (tf32_matmul.SPEC, "tf32", 1.0, "TF32 matmuls", "inputs rounded to a 10-bit mantissa"),
        (autocast_bf16.SPEC, "bf16", 0.5, "bf16 autocast around the forward", "matmuls in bf16 (8-bit mantissa)"),
    ):
        if not peaks.get(key):
            continue
        saved = saved_per_step(profile, key, factor)
        recs.append(Recommendation(
            id=spec.name.replace("_", "-"), remedy=spec.name,
            title=f"{title}: fp32 matmuls take {share:.0%} of the step",
            params={},
            predicted=Prediction(peak_memory_bytes=None, step_time_s=step - saved),
            baseline=Prediction(peak_memory_bytes=None, step_time_s=step),
            cost_model=f"each fp32 matmul/conv at its achieved roof share, roof at the {key} peak"
                       + (" with half the bytes" if factor != 1.0 else ""),
            confidence="medium", exact=False, live=True, apply_class=spec.apply_class,
            prerequisites=[f"a CUDA device with {key} tensor cores", f"changes numerics: {why}"],
            evidence=lines + [f"saves {ms(saved)} per step"], fits=True,
        ))
    return Finding(bottleneck="compute", summary=f"fp32 matmuls take {share:.0%} of the step near their roof",
                   severity=share, evidence=evidence, recommendations=recs)


RULE = compute_rule
