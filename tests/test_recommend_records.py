"""Recommender records: the report contract's keys, JSON safety, and input validation."""

from __future__ import annotations

import json
import math

import pytest

from advisor.records.advice import CurvePoint, Diagnosis, Evidence, Prediction, Recommendation, fits_budget


def _rec(**changes) -> Recommendation:
    fields = dict(
        id="checkpoint-blocks-3", remedy="activation_checkpointing", title="Checkpoint 3 blocks",
        params={"modules": ("blocks.0", "blocks.1", "blocks.2")},
        predicted=Prediction(peak_memory_bytes=700, step_time_s=1.2),
        baseline=Prediction(peak_memory_bytes=1000, step_time_s=1.0), budget_bytes=800,
        cost_model="dp", confidence="high", exact=True, live=True,
        curve=[CurvePoint(budget_bytes=800, overhead_s=math.inf, peak_memory_bytes=700, modules_count=3)],
    )
    fields.update(changes)
    return Recommendation(**fields)


def test_recommendation_to_dict_has_the_contract_keys_and_is_json() -> None:
    out = _rec().to_dict()
    assert set(out) == {"id", "remedy", "title", "params", "predicted", "baseline", "cost_model", "confidence",
                        "exact", "live", "prerequisites", "evidence", "curve", "fits", "budget_bytes",
                        "apply_class", "calibration", "block_plan", "applicable", "why", "parts"}
    assert out["params"] == {"modules": ["blocks.0", "blocks.1", "blocks.2"]}  # tuples become lists
    assert out["predicted"] == {"peak_memory_bytes": 700, "step_time_s": 1.2}
    assert out["curve"][0]["overhead_s"] is None  # non-finite floats are not JSON
    json.dumps(out, allow_nan=False)


def test_diagnosis_to_dict() -> None:
    d = Diagnosis(bottleneck="memory", summary="s", evidence=(Evidence(what="peak", value=float("nan")),
                                                               Evidence(what="share", value=0.95, threshold=0.9)))
    assert d.to_dict() == {"bottleneck": "memory", "summary": "s", "evidence": [
        {"what": "peak", "value": None}, {"what": "share", "value": 0.95, "threshold": 0.9}]}  # no null keys added
    assert Diagnosis.from_dict(d.to_dict()).evidence[1] == d.evidence[1]


def test_a_recommendation_decodes_back_with_every_field_checked() -> None:
    rec = _rec(params={"modules": ["blocks.0"]}, curve=None)
    assert Recommendation.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec
    bad = rec.to_dict()
    bad["predicted"]["peak_memory_bytes"] = "700"
    with pytest.raises(ValueError, match=r"Recommendation\.predicted\.peak_memory_bytes: expected an integer"):
        Recommendation.from_dict(bad)
    with pytest.raises(ValueError, match=r"Recommendation\.budget_bytes: missing"):
        Recommendation.from_dict({k: v for k, v in rec.to_dict().items() if k != "budget_bytes"})


def test_fits_follows_from_the_predicted_peak_and_the_budget_never_from_a_flag() -> None:
    assert fits_budget(700, 800) and not fits_budget(900, 800)
    assert not fits_budget(None, 800)  # says nothing of memory: does not fit a budget
    assert fits_budget(None, None) and fits_budget(10**12, None)  # no budget: nothing to exceed
    assert _rec().fits and not _rec(budget_bytes=600).fits
    unknown = _rec(predicted=Prediction(peak_memory_bytes=None, step_time_s=0.5))
    assert not unknown.fits and unknown.to_dict()["fits"] is False
    forged = {**unknown.to_dict(), "fits": True}  # a wire "fits" is never believed
    assert not Recommendation.from_dict(forged).fits


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Diagnosis(bottleneck="disk", summary=""), "valid: memory, compute"),
        (lambda: _rec(remedy="no such"), "must be a Python identifier"),
        (lambda: _rec(confidence="sure"), "valid: high, medium, low"),
    ],
)
def test_bad_values_name_the_valid_options(build, message) -> None:
    with pytest.raises(ValueError, match=message):
        build()
