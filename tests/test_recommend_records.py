"""Recommender records: the report contract's keys, JSON safety, and input validation."""

from __future__ import annotations

import json
import math

import pytest

from advisor.records.advice import CurvePoint, Diagnosis, Prediction, Recommendation


def _rec(**changes) -> Recommendation:
    fields = dict(
        id="checkpoint-blocks-3", remedy="activation_checkpointing", title="Checkpoint 3 blocks",
        params={"modules": ("blocks.0", "blocks.1", "blocks.2")},
        predicted=Prediction(peak_memory_bytes=700, step_time_s=1.2),
        baseline=Prediction(peak_memory_bytes=1000, step_time_s=1.0),
        cost_model="dp", confidence="high", exact=True, live=True,
        curve=[CurvePoint(budget_bytes=800, overhead_s=math.inf, peak_memory_bytes=700, modules_count=3)],
    )
    fields.update(changes)
    return Recommendation(**fields)


def test_recommendation_to_dict_has_the_contract_keys_and_is_json() -> None:
    out = _rec().to_dict()
    assert set(out) == {"id", "remedy", "title", "params", "predicted", "baseline", "cost_model", "confidence",
                        "exact", "live", "prerequisites", "evidence", "curve", "fits", "apply_class",
                        "calibration", "block_plan"}
    assert out["params"] == {"modules": ["blocks.0", "blocks.1", "blocks.2"]}  # tuples become lists
    assert out["predicted"] == {"peak_memory_bytes": 700, "step_time_s": 1.2}
    assert out["curve"][0]["overhead_s"] is None  # non-finite floats are not JSON
    json.dumps(out, allow_nan=False)


def test_diagnosis_to_dict() -> None:
    d = Diagnosis(bottleneck="memory", summary="s", evidence=[{"what": "peak", "value": float("nan")}])
    assert d.to_dict() == {"bottleneck": "memory", "summary": "s", "evidence": [{"what": "peak", "value": None}]}


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Diagnosis(bottleneck="disk", summary=""), "valid: memory, compute"),
        (lambda: _rec(remedy="magic"), "valid: activation_checkpointing"),
        (lambda: _rec(confidence="sure"), "valid: high, medium, low"),
    ],
)
def test_bad_values_name_the_valid_options(build, message) -> None:
    with pytest.raises(ValueError, match=message):
        build()
