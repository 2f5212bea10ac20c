"""Pure formatting helpers of the TUI: exact strings, and None never crashes."""

from __future__ import annotations

import math

import pytest

from advisor.tui.format import (
    MISSING,
    bar,
    fmt_bytes,
    fmt_change,
    fmt_loss,
    fmt_ms,
    fmt_seconds,
    fmt_transition_bytes,
    fmt_transition_seconds,
    sparkline,
)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, MISSING),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536 * 1024, "1.50 MiB"),
        (3 * 1024**3, "3.00 GiB"),
        (int(42.5 * 1024**3), "42.5 GiB"),
        (141 * 1024**3, "141 GiB"),
        (-2 * 1024**2, "-2.00 MiB"),
        (float("nan"), MISSING),
    ],
)
def test_fmt_bytes(value: float | None, text: str) -> None:
    assert fmt_bytes(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, MISSING),
        (0, "0 s"),
        (850e-6, "850 µs"),
        (0.0123, "12.3 ms"),
        (0.125, "125 ms"),
        (1.25, "1.25 s"),
        (125, "2m05s"),
        (math.inf, MISSING),
    ],
)
def test_fmt_seconds(value: float | None, text: str) -> None:
    assert fmt_seconds(value) == text


def test_fmt_ms_and_loss() -> None:
    assert fmt_ms(0.0123) == "12.3" and fmt_ms(1.25) == "1250" and fmt_ms(None) == MISSING
    assert fmt_loss(2.345678) == "2.346" and fmt_loss(1e-5) == "1.000e-05" and fmt_loss(None) == MISSING


def test_fmt_change_and_transitions() -> None:
    assert fmt_change(100, 67) == "-33%"
    assert fmt_change(100, 104.2) == "+4.2%"
    assert fmt_change(100, 100) == "±0%"
    assert fmt_change(0, 5) == MISSING and fmt_change(None, 5) == MISSING
    assert fmt_transition_bytes(3 * 1024**3, 2 * 1024**3) == "3.00 GiB → 2.00 GiB (-33%)"
    assert fmt_transition_seconds(0.1, None) == "100 ms → — (—)"


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▁▁▁"
    assert sparkline([1, None, 3]) == "▁ █"  # a missing loss stays a visible gap
    assert sparkline([]) == "" and sparkline([None, None]) == "  "
    assert sparkline(list(range(100)), width=10) == "▁▂▃▃▄▅▆▆▇█"


def test_bar_fills_in_eighths() -> None:
    assert bar(1, 1, 4) == "████"
    assert bar(0.5, 1, 4) == "██  "
    assert bar(1, 16, 2) == "▏ "
    assert bar(0, 1, 3) == "   " and bar(1, 0, 3) == "   "
    assert bar(2, 1, 3) == "███"  # clipped, never wider than asked
