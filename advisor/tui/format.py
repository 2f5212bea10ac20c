"""Pure formatting helpers for the terminal UI: changes, sparklines, bars (bytes and seconds come
from ``advisor.records.units``).

No textual or rich here, so the headless printer can share these and tests can
check them without starting an app. ``None`` always renders as an em dash, so a
missing measurement never crashes a redraw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# One unit style everywhere: the byte and duration formatters live in records/units.py and are
# re-exported here for the TUI's callers.
from advisor.records.units import MISSING, fmt_bytes, fmt_seconds

__all__ = ["MISSING", "bar", "fmt_bytes", "fmt_change", "fmt_loss", "fmt_ms", "fmt_seconds",
           "fmt_transition_bytes", "fmt_transition_seconds", "sparkline"]

_SPARK_BLOCKS = "▁▂▃▄▅▆▇█"


def _finite(value: float | int | None) -> bool:
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))


def fmt_ms(value: float | None) -> str:
    """Seconds as a bare millisecond figure for dense tables: ``12.3``, ``250``, ``1250``."""
    if not _finite(value):
        return MISSING
    assert value is not None
    ms = float(value) * 1e3
    return f"{ms:.1f}" if abs(ms) < 100 else f"{ms:.0f}"


def fmt_loss(value: float | None) -> str:
    """Loss with four significant figures; scientific notation when tiny or huge."""
    if not _finite(value):
        return MISSING
    assert value is not None
    v = float(value)
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.3e}"
    return f"{v:.4g}"


def fmt_change(before: float | int | None, after: float | int | None) -> str:
    """Relative change from ``before`` to ``after`` as a signed percentage: ``-35%``, ``+4.2%``."""
    if not (_finite(before) and _finite(after)) or not before:
        return MISSING
    assert before is not None and after is not None
    pct = (float(after) - float(before)) / abs(float(before)) * 100
    if abs(pct) < 0.05:
        return "±0%"
    return f"{pct:+.1f}%" if abs(pct) < 10 else f"{pct:+.0f}%"


def fmt_transition_bytes(before: int | float | None, after: int | float | None) -> str:
    """``3.00 GiB → 2.00 GiB (-33%)``: what a remedy does to memory."""
    return f"{fmt_bytes(before)} → {fmt_bytes(after)} ({fmt_change(before, after)})"


def fmt_transition_seconds(before: float | None, after: float | None) -> str:
    """``120 ms → 135 ms (+12%)``: what a remedy does to step time."""
    return f"{fmt_seconds(before)} → {fmt_seconds(after)} ({fmt_change(before, after)})"


def sparkline(values: Sequence[float | int | None], width: int = 40) -> str:
    """The last ``width`` values as block characters scaled between their min and max.

    Missing or non-finite values become a space, so gaps in the loss stay visible.
    """
    tail = list(values)[-width:] if width > 0 else []
    finite = [float(v) for v in tail if _finite(v)]
    if not finite:
        return " " * len(tail)
    low, high = min(finite), max(finite)
    span = high - low
    out = []
    for v in tail:
        if not _finite(v):
            out.append(" ")
            continue
        assert v is not None
        level = 0 if span == 0 else int((float(v) - low) / span * (len(_SPARK_BLOCKS) - 1) + 0.5)
        out.append(_SPARK_BLOCKS[level])
    return "".join(out)


def bar(value: float, maximum: float, width: int = 20) -> str:
    """A horizontal bar of ``width`` cells filled in proportion ``value / maximum`` (eighth-cell steps)."""
    if width <= 0:
        return ""
    if not (_finite(value) and _finite(maximum)) or maximum <= 0 or value <= 0:
        return " " * width
    eighths = int(round(min(value / maximum, 1.0) * width * 8))
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part else ""
    return ("█" * full + partial).ljust(width)
