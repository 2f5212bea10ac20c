"""Sizes as people type and read them: one parser and one formatter for every surface.

Torch-free: the controller's CLI, report and TUI and the training process share it.
"""

from __future__ import annotations

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


def format_size(nbytes: int | None) -> str:
    """Human-readable binary size (``"1.50 GiB"``); ``"-"`` for None."""
    if nbytes is None:
        return "-"
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
