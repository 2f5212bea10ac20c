"""MFU takes each dtype's FLOPs against that dtype's own peak (issue 21, item 13)."""

from __future__ import annotations

import pytest

from advisor.recommend.roofline import OpFigures
from advisor.sections.compute import mfu_by_dtype

PEAKS = {"fp32": 48e9, "fp64": 12e9, "bf16": 96e9}


def _ops(*pairs: tuple[float, str]) -> list[OpFigures]:
    return [OpFigures(flops=f, bytes=1.0, time_s=0.001, dtype=d) for f, d in pairs]


def test_float64_work_is_judged_against_the_fp64_peak() -> None:
    assert mfu_by_dtype(_ops((6e9, "float64")), 1.0, PEAKS) == pytest.approx(0.5)


def test_mixed_precision_step_adds_each_dtypes_share_of_the_step() -> None:
    # 48 GFLOP of bf16 matmuls need 0.5 s at the bf16 peak; 12 GFLOP of fp32 need 0.25 s.
    assert mfu_by_dtype(_ops((48e9, "bfloat16"), (12e9, "float32")), 1.0, PEAKS) == pytest.approx(0.75)


def test_work_without_a_peak_of_its_own_has_no_mfu() -> None:
    assert mfu_by_dtype(_ops((6e9, "float16"), (1e9, "float32")), 1.0, PEAKS) is None
    # A dtype with a negligible share of the FLOPs does not make MFU unknown.
    assert mfu_by_dtype(_ops((1e6, "float16"), (48e9, "float32")), 1.0, PEAKS) == pytest.approx(1.0, rel=1e-3)
