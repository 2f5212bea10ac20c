"""What an importer holds at most: every size, count, rank and world size read from an artifact is
checked against these before anything is allocated for it.

Why limits rather than trust: an artifact is a file someone sent. A 633-byte trace naming a world
of 10^12 ranks, a 547-byte pickle whose memo repeats one list into a 100 GB string, or a 17 MB
gzip of 3 million steps each took the host's memory before. Real artifacts sit far below every
limit (a profiled schedule is tens of steps, a job at most tens of thousands of ranks); one above
is refused in one line (``LimitError``), which ``advisor import`` reports with exit 3.
"""

from __future__ import annotations

from typing import Any


class LimitError(ValueError):
    """The artifact asks for more than the importer holds (the message names what and the limit)."""


MAX_RANKS = 65536  # ranks in one job (world size, rank), as the controller's intake allows
MAX_STEPS = 50_000  # ProfilerStep#N spans per trace file
MAX_SPANS = 500_000  # each kind of other kept span per trace file (data waits, collectives, kernels...)
MAX_OPS = 4_000_000  # CPU ops and GPU kernels per trace file (about 40 bytes each)
MAX_SIGNATURES = 200_000  # distinct (op, shapes, types) per trace file
MAX_SIGNATURE_CHARS = 64 << 20  # their text, together
MAX_NAME = 1024  # characters of an event's name (longer ones are cut, never kept whole)
MAX_STEP_INDEX = (1 << 31) - 1
MAX_INT = (1 << 63) - 1  # what SQLite and every JSON reader can hold

MAX_SNAPSHOT_ITEMS = 20_000_000  # segments, blocks, trace entries and frames visited in a snapshot
MAX_FRAMES = 256  # frames kept of one allocation's stack (innermost first)
MAX_DEVICES = 1024


def check_count(count: int, limit: int, what: str, hint: str = "") -> None:
    """``LimitError`` once ``count`` passes ``limit``."""
    if count > limit:
        raise LimitError(f"more than {limit:,} {what}: over what the importer holds{hint}")


def bounded_int(value: Any, *, low: int = 0, high: int = MAX_INT) -> int | None:
    """``value`` if it is an integer (not a bool) in [low, high], else None."""
    if type(value) is int and low <= value <= high:
        return value
    return None
