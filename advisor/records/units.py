"""Sizes as people type and read them: one parser and one formatter for every surface.

Torch-free: the controller's CLI, report and TUI and the training process share it.
"""

from __future__ import annotations

import math
import re

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tib": 2**40,
}

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in a size such as ``"12GiB"``, ``"800MiB"``, ``"1.5GB"`` or ``"123"``.

    Binary units (KiB, MiB, GiB, TiB, and the bare K, M, G, T) are powers of 1024; decimal units
    (kB, MB, GB, TB) are powers of 1000. Raises ``ValueError`` naming the valid units.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {text}")
        return text
    match = _SIZE.match(str(text))
    if match is None:
        raise ValueError(
            f"not a size: {text!r}; write a number with an optional unit, e.g. 12GiB, 800MiB, 1.5GB"
        )
    number, unit = match.groups()
    try:
        scale = _UNITS[unit.lower()]
    except KeyError:
        valid = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB (K, M, G, T mean KiB..TiB)"
        raise ValueError(f"unknown size unit {unit!r} in {text!r}; valid units: {valid}") from None
    return int(round(float(number) * scale))


MISSING = "—"  # an em dash: a missing figure never crashes a redraw and never reads as zero
_BYTE_UNITS: tuple[str, ...] = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def _finite(value: float | int | None) -> bool:
    return value is not None and not isinstance(value, bool) and math.isfinite(float(value))


def _three_figures(value: float) -> str:
    """``value`` (>= 1 after scaling) with three significant figures: 1.50, 42.5, 141."""
    digits = 2 if value < 9.995 else 1 if value < 99.95 else 0
    return f"{value:.{digits}f}"


def fmt_bytes(value: int | float | None) -> str:
    """A size in binary units chosen by magnitude, three significant figures: ``1.50 GiB``,
    ``258 KiB``, ``34.4 MiB``; whole bytes below 1 KiB; :data:`MISSING` for None, NaN or inf.

    The one byte formatter of every surface (report, TUI, evidence, recommendation titles).
    """
    if not _finite(value):
        return MISSING
    assert value is not None  # for the type checker; _finite said so
    sign = "-" if value < 0 else ""
    size = float(abs(value))
    unit = 0
    # Round first, so 1023.9 KiB reads "1.00 MiB" rather than "1024 KiB".
    while unit < len(_BYTE_UNITS) - 1 and (size >= 1024 or (unit > 0 and float(_three_figures(size)) >= 1024)):
        size /= 1024
        unit += 1
    if unit == 0:
        return f"{sign}{int(size)} B"
    return f"{sign}{_three_figures(size)} {_BYTE_UNITS[unit]}"


def fmt_seconds(value: float | None) -> str:
    """A duration in the unit a person reads fastest, three significant figures:
    ``850 µs``, ``12.3 ms``, ``125 ms``, ``1.25 s``, ``2m05s``; :data:`MISSING` for None."""
    if not _finite(value):
        return MISSING
    assert value is not None
    sign = "-" if value < 0 else ""
    v = abs(float(value))
    if v == 0:
        return "0 s"
    if v < 1e-6:
        return f"{sign}{v * 1e9:.0f} ns"
    if v < 0.9995e-3:
        return f"{sign}{_three_figures(v * 1e6)} µs"
    if v < 0.9995:
        return f"{sign}{_three_figures(v * 1e3)} ms"
    if v < 59.95:
        return f"{sign}{_three_figures(v)} s"
    minutes, seconds = divmod(int(round(v)), 60)
    return f"{sign}{minutes}m{seconds:02d}s"


_SI_PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def fmt_rate(value: float | None, unit: str = "B/s") -> str:
    """A rate in decimal (SI) prefixes, as bandwidths and FLOP/s are quoted, three significant
    figures: ``2.29 GB/s``, ``850 MB/s``, ``206 TFLOP/s``; :data:`MISSING` for None, NaN or inf."""
    if not _finite(value):
        return MISSING
    assert value is not None
    sign = "-" if value < 0 else ""
    size, prefix = abs(float(value)), 0
    while prefix < len(_SI_PREFIXES) - 1 and float(_three_figures(size)) >= 1000:
        size /= 1000
        prefix += 1
    return f"{sign}{_three_figures(size) if size >= 0.9995 else f'{size:.3g}'} {_SI_PREFIXES[prefix]}{unit}"


def format_size(nbytes: int | None) -> str:
    """Kept for callers of the older name: the same as :func:`fmt_bytes`."""
    return fmt_bytes(nbytes)


def fmt_quantity(value: object, unit: str | None) -> str:
    """A figure that travels with its unit (a diagnosis's evidence item): bytes and seconds go
    through :func:`fmt_bytes` and :func:`fmt_seconds`; anything else is ``value unit``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if unit in ("bytes", "B"):
            return fmt_bytes(value)
        if unit in ("s", "seconds"):
            return fmt_seconds(value)
        if unit in ("B/s", "FLOP/s"):
            return fmt_rate(value, unit)
    if value is None:
        return MISSING
    return f"{value} {unit}" if unit else str(value)


def parse_rate(text: str | float) -> float:
    """Bytes per second in a rate such as ``"16GB/s"``, ``"12.5GiB/s"``, ``"25e9"`` or ``"800MiB"``
    (the ``/s`` is optional; units as :func:`parse_size`). Raises ``ValueError`` on anything
    that is not a positive, finite rate."""
    if isinstance(text, bool):
        raise ValueError(f"not a rate: {text!r}")
    raw = str(text).strip()
    body = raw[:-2].rstrip() if raw.lower().endswith("/s") else raw
    try:
        value = float(body)  # a bare number, exponent allowed (25e9)
    except ValueError:
        try:
            value = float(parse_size(body))
        except ValueError:
            raise ValueError(f"not a rate: {raw!r}; write bytes per second, e.g. 16GB/s, 12.5GiB/s or 25e9") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"a rate must be more than 0 bytes/s, got {raw!r}")
    return value


# Terminal control sequences: CSI (ESC [ ... final byte), OSC (ESC ] ... BEL or ESC \), other
# two-byte escapes, then any remaining C0 or C1 control character and DEL. An op name, a module
# name or an exception text comes from the user's program: printed raw, ``\x1b[2J`` clears the
# reader's screen and ``\x1b]8;;...`` plants a link.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_LINE_BREAKS = re.compile(r"[\t\n\r]")


def plain_text(value: object, *, one_line: bool = True) -> str:
    """``value`` as text a terminal shows as it is: terminal control sequences and control
    characters removed, every other character kept (brackets and backslashes too: the caller
    renders it as text, never as markup). ``one_line``: tabs and line breaks become spaces (a
    name in a table cell); otherwise tabs and line breaks stay (an exception's message).

    The one cleaning step of every user-derived string on every surface (report, Markdown, TUI).
    """
    text = _ESCAPES.sub("", str(value))
    if one_line:
        text = _LINE_BREAKS.sub(" ", text)
    return _CONTROLS.sub("", text)
