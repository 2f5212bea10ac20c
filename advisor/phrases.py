"""Sentences more than one surface prints the same way (the rich report, Markdown, the TUI)."""

from __future__ import annotations

from typing import Any

from advisor.records.units import MISSING, fmt_seconds


def exit_line(exit_: dict[str, Any]) -> str:
    """``code 0 · completed``; a session with no exit recorded says so instead of "code None"."""
    if exit_.get("code") is None:
        return "still running or interrupted: no exit recorded"
    return f"code {exit_['code']} · {exit_.get('reason') or ''}".rstrip(" ·")


def _percent(value: float) -> str:
    return f"{100 * value:+.1f}%"


def calibration_line(rec: dict[str, Any]) -> str | None:
    """``calibrated 41.2 ms (38.0 ms-45.1 ms), model error +12.0% over 2 applies`` for a
    recommendation whose remedy was applied earlier in the session; None otherwise."""
    cal = rec.get("calibration")
    if not cal:
        return None
    applies = cal.get("applies", 0)
    error, shift = cal.get("model_error", 0.0), cal.get("shift_error")
    line = (f"calibrated {fmt_seconds(cal.get('step_time_s'))} ({fmt_seconds(cal.get('low_s'))}-"
            f"{fmt_seconds(cal.get('high_s'))}), model error {_percent(error)} over {applies} apply"
            + ("" if applies == 1 else "s"))
    if shift is not None and abs(shift - error) > 1e-9:  # one window moves the calibration a bounded amount
        line += f", shifted by {_percent(shift)} at most"
    return line


def applied_time_line(applied: dict[str, Any]) -> str | None:
    """``step predicted 40.0 ms, measured 36.0 ms, model error +11.1%`` for one apply; None
    when either side was not measured."""
    predicted = (applied.get("predicted") or {}).get("step_time_s")
    measured = (((applied.get("measured") or {}).get("after")) or {}).get("step_time_s")
    if predicted is None or not measured:
        return None
    kind = (((applied.get("measured") or {}).get("after")) or {}).get("step_kind")
    if kind == "deep":  # the prediction is for an ordinary step: no model error from probed steps
        return (f"step predicted {fmt_seconds(predicted)}, measured {fmt_seconds(measured)} on deep-sampled "
                "steps (not comparable)")
    return (f"step predicted {fmt_seconds(predicted)}, measured {fmt_seconds(measured)}, "
            f"model error {_percent((predicted - measured) / measured)}")


def predicted_step(rec: dict[str, Any]) -> str:
    """A recommendation's predicted step time, saying what it is a step of: gradient accumulation
    predicts one micro-batch (of k) against the baseline's one-batch step, comparable per sample;
    shown bare, "1.28 ms" beside a 20.1 ms baseline read as a 16x speed-up."""
    text = fmt_seconds((rec.get("predicted") or {}).get("step_time_s"))
    micro = (rec.get("params") or {}).get("micro_batches")
    if rec.get("remedy") == "grad_accumulation" and micro and text != MISSING:
        text += f" per micro-batch (1 of {micro})"
    return text
