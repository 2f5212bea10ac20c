"""Step-time calibration (issue 14): each remedy's model error over the session's applies, and
later predictions of that remedy shifted and widened by it (recommend/calibration.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.advice import advise_state
from advisor.phrases import applied_time_line, calibration_line
from advisor.recommend.advise import advise
from advisor.recommend.calibration import TRUSTED_APPLIES, calibrate, model_errors
from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.records.advice import Prediction, Recommendation
from advisor.records.results import ApplyResult, Measurement, RevertResult
from advisor.report import build_report
from recorded import load_state


def _applied(remedy: str, at_step: int, predicted: float | None, measured: float | None, *, rank: int = 0,
             status: str = "kept", peak: tuple[int, int] | None = None, kind: str | None = None) -> ApplyResult:
    p_peak, m_peak = peak or (None, None)
    return ApplyResult(remedy=remedy, recommendation_id=f"{remedy}-x", rank=rank, at_step=at_step,
                       predicted=Measurement(peak_memory_bytes=p_peak, step_time_s=predicted),
                       before=Measurement(step_time_s=1.0),
                       after=Measurement(step_time_s=measured, peak_memory_bytes=m_peak, step_kind=kind), status=status)


def _rec(remedy: str, step_time: float | None, rid: str | None = None) -> Recommendation:
    return Recommendation(id=rid or remedy, remedy=remedy, title=remedy, params={},
                          predicted=Prediction(peak_memory_bytes=100, step_time_s=step_time),
                          baseline=Prediction(peak_memory_bytes=200, step_time_s=1.0), budget_bytes=None,
                          cost_model="test", confidence="medium", exact=True, live=True)


def test_errors_per_remedy_one_per_apply_failed_and_user_reverts_left_out():
    applied = [
        _applied("activation_checkpointing", 5, 1.2, 1.0, peak=(110, 100)),
        _applied("activation_checkpointing", 5, 1.2, 1.5, rank=1),  # same apply on rank 1: median of ranks
        _applied("fused_optimizer", 9, 0.9, 1.0, status="reverted"),  # reverted after its window: measured
        _applied("zero", 12, 1.0, None, status="failed"),
        RevertResult(remedy="fused_optimizer", recommendation_id="fused_optimizer-x", at_step=20),  # a user's revert
        _applied("activation_checkpointing", 30, 2.0, 1.6),
    ]
    errors = model_errors(applied)
    assert set(errors) == {"activation_checkpointing", "fused_optimizer"}
    ckpt = errors["activation_checkpointing"]
    first, second = ckpt.applies
    assert (first.at_step, first.ranks) == (5, (0, 1))
    assert first.measured_step_time_s == pytest.approx(1.25)  # median of 1.0 and 1.5
    assert first.step_time_error == pytest.approx((1.2 - 1.25) / 1.25)
    assert first.peak_error == pytest.approx(0.1)
    assert second.step_time_error == pytest.approx(0.25)
    assert ckpt.step_time_error == pytest.approx(((1.2 - 1.25) / 1.25 + 0.25) / 2)
    assert errors["fused_optimizer"].step_time_error == pytest.approx(-0.1)
    row = ckpt.to_dict()
    assert row["applies"] == 2 and row["step_time_samples"] == 2 and len(row["history"]) == 2
    assert row["history"][1]["predicted_step_time_s"] == 2.0 and row["history"][1]["measured_step_time_s"] == 1.6


def test_a_window_timed_on_deep_steps_gives_no_step_time_error():
    """Predictions are for ordinary steps; a deep-timed window (probes on) is not a measurement of them."""
    deep = _applied("activation_checkpointing", 5, 1.0, 1.6, peak=(100, 100), kind="deep")
    light = _applied("activation_checkpointing", 9, 1.2, 1.0, kind="light")
    errors = model_errors([deep, light])["activation_checkpointing"]
    assert [a.step_time_error for a in errors.applies] == [None, pytest.approx(0.2)]
    assert errors.applies[0].peak_error == 0.0  # the deep window's peak still counts
    assert errors.step_time_error == pytest.approx(0.2)


def test_one_apply_shifts_the_prediction_and_keeps_the_model_in_the_interval():
    errors = model_errors([_applied("activation_checkpointing", 5, 1.2, 1.0)])
    rec = calibrate(_rec("activation_checkpointing", 3.0), errors["activation_checkpointing"])
    cal = rec.calibration
    assert rec.predicted.step_time_s == 3.0  # the model's own figure is kept: errors are measured against it
    assert cal.model_step_time_s == 3.0 and cal.model_error == pytest.approx(0.2) and cal.applies == 1
    assert cal.step_time_s == pytest.approx(2.5)
    assert (cal.low_s, cal.high_s) == (pytest.approx(2.5), 3.0)


def test_enough_applies_give_the_interval_of_their_errors_alone():
    applied = [_applied("activation_checkpointing", 5 + i, 1.0 + e, 1.0) for i, e in enumerate((0.1, 0.2, 0.25))]
    assert len(applied) >= TRUSTED_APPLIES
    rec = calibrate(_rec("activation_checkpointing", 2.4), model_errors(applied)["activation_checkpointing"])
    cal = rec.calibration
    assert cal.model_error == pytest.approx(0.2)
    assert cal.step_time_s == pytest.approx(2.0)
    assert cal.low_s == pytest.approx(2.4 / 1.25) and cal.high_s == pytest.approx(2.4 / 1.1)


def test_other_remedies_and_predictions_without_time_are_left_alone():
    errors = model_errors([_applied("activation_checkpointing", 5, 1.2, 1.0)])
    assert calibrate(_rec("fused_optimizer", 1.0), errors.get("fused_optimizer")).calibration is None
    assert calibrate(_rec("activation_checkpointing", None), errors["activation_checkpointing"]).calibration is None


def test_ranking_uses_the_calibrated_step_time():
    """Raw, checkpointing (1.0 s) beats offload (1.1 s); its model proved 25% optimistic, so the
    calibrated 1.25 s ranks it second."""
    recs = [_rec("activation_checkpointing", 1.0), _rec("cpu_offload", 1.1)]

    def rule(profile):
        return Finding(rule="memory", bottleneck="memory", summary="over budget", severity=1.0,
                       recommendations=list(recs))

    profile = Profile(peak_bytes=200, budget_bytes=150)
    _, plain = advise(profile, rules=[rule])
    assert [r.remedy for r in plain] == ["activation_checkpointing", "cpu_offload"]
    errors = model_errors([_applied("activation_checkpointing", 5, 0.8, 1.0)])
    _, calibrated = advise(profile, rules=[rule], errors=errors)
    assert [r.remedy for r in calibrated] == ["cpu_offload", "activation_checkpointing"]
    assert calibrated[1].calibration.step_time_s == pytest.approx(1.25)
    assert calibrated[0].calibration is None


def test_a_recorded_session_re_advised_after_an_apply_carries_the_model_error():
    """The recorded GPT session under a budget recommends checkpointing; after an apply of it that
    ran 10% faster than predicted (then reverted), re-advice shows the same plan calibrated."""
    state = load_state("gpt")
    budget = int(0.7 * build_report(state)["memory"]["peak_bytes"])
    _, before = advise_state(state, budget_bytes=budget)
    (rec,) = [r for r in before if r.remedy == "activation_checkpointing"]
    assert rec.calibration is None
    model = rec.predicted.step_time_s
    state.applied = [_applied("activation_checkpointing", 4, model, model / 1.1, status="reverted")]
    _, after = advise_state(state, budget_bytes=budget)
    (again,) = [r for r in after if r.remedy == "activation_checkpointing"]
    assert again.predicted.step_time_s == model
    cal = again.calibration
    assert cal.model_error == pytest.approx(0.1) and cal.applies == 1
    assert cal.step_time_s == pytest.approx(model / 1.1)
    assert (cal.low_s, cal.high_s) == (pytest.approx(model / 1.1), model)
    report = build_report(state, budget_bytes=budget)
    (row,) = report["calibration"]
    assert row["remedy"] == "activation_checkpointing" and row["step_time_error"] == pytest.approx(0.1)
    assert calibration_line(again.to_dict()).endswith("model error +10.0% over 1 apply")  # the report's rows
    assert applied_time_line(state.applied[0].as_history()).endswith("model error +10.0%")


def test_one_wild_window_moves_the_calibration_by_a_bounded_amount():
    """A window that read 10x the model's error (a noisy "489 ms -> 98.8 ms" once made a +992%
    model error and a "calibrated 22.9 ms" for a 235 ms job) shifts the next prediction by 25% at
    most; the error measured is still shown, and a second apply that agrees doubles the bound."""
    wild = _applied("activation_checkpointing", 5, 1.078, 0.0988)
    errors = model_errors([wild])["activation_checkpointing"]
    assert errors.step_time_error == pytest.approx(9.911, abs=1e-3)  # measured, recorded as it is
    cal = calibrate(_rec("activation_checkpointing", 0.235), errors).calibration
    assert cal.model_error == pytest.approx(9.911, abs=1e-3)
    assert cal.step_time_s == pytest.approx(0.235 / 1.25)  # not 0.235 / 10.9 = 21.6 ms
    assert cal.low_s == pytest.approx(0.235 / 1.25) and cal.high_s == pytest.approx(0.235)
    line = calibration_line(replace(_rec("activation_checkpointing", 0.235), calibration=cal).to_dict())
    assert "model error +991.1%" in line and line.endswith("shifted by +25.0% at most")
    two = model_errors([wild, _applied("activation_checkpointing", 9, 1.078, 0.0988)])["activation_checkpointing"]
    assert calibrate(_rec("activation_checkpointing", 0.235), two).calibration.step_time_s == pytest.approx(0.235 / 1.5)


def test_a_window_whose_steps_spread_wider_than_its_mean_does_not_correct():
    """The window's light steps come from the session's records: their spread is shown, and a
    window spread over more than half its mean measured noise as much as the remedy."""
    from advisor.records.samples import StepSample

    def window(first: int, times: list[float]) -> tuple[ApplyResult, list[StepSample]]:
        steps = [StepSample(index=first + i, time_s=t) for i, t in enumerate(times)]
        mean = sum(times) / len(times)
        result = _applied("activation_checkpointing", first, 1.2, mean)
        after = Measurement(step_time_s=mean, time_steps=tuple(s.index for s in steps), step_kind="light")
        return result.with_(after=after), steps

    steady, steady_steps = window(5, [0.98, 1.0, 1.02])
    noisy, noisy_steps = window(20, [0.3, 1.0, 1.7])
    errors = model_errors([steady, noisy], {0: steady_steps + noisy_steps})["activation_checkpointing"]
    first, second = errors.applies
    assert (first.measured_steps, first.measured_low_s, first.measured_high_s) == (3, 0.98, 1.02)
    assert not first.noisy and second.noisy and (second.measured_low_s, second.measured_high_s) == (0.3, 1.7)
    assert errors.step_time_errors == [pytest.approx(0.2)]  # the noisy window is left out of the shift
    row = errors.to_dict()
    assert row["noisy_windows"] == 1 and row["history"][1]["noisy"] is True
    assert row["history"][0]["measured_low_s"] == 0.98
    assert model_errors([noisy])["activation_checkpointing"].step_time_errors  # without steps: no spread known
