"""A stored session's metadata, checked once where it is read.

The ``meta`` table is the controller's own, but a session folder is a file a user can copy,
edit or receive: ``ranks_hosted: 5`` or ``created: "yesterday"`` used to end ``advisor report``
in a traceback and take ``advisor sessions`` down for every session of the home. Each key a
reader uses is checked against its type here; a wrong one is a ``SessionError`` (exit 3) that
names the file and the key, and ``advisor sessions`` lists that one session as unreadable.
Keys a newer controller added are kept as they are.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from advisor.errors import SessionError

MAX_RANKS = 1 << 20  # as the channel's hello allows

Check = Callable[[Any], str | None]


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _string(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _integer(low: int, high: int) -> Check:
    def check(value: Any) -> str | None:
        ok = type(value) is int and low <= value <= high
        return None if ok else f"an integer from {low} to {high}"
    return check


def _time(value: Any) -> str | None:
    ok = type(value) in (int, float) and math.isfinite(value) and 0 <= value < 1e11
    return None if ok else "a time in seconds since 1970"


def _strings(value: Any) -> str | None:
    return None if isinstance(value, list) and all(isinstance(v, str) for v in value) else "a list of strings"


def _ranks(value: Any) -> str | None:
    ok = (isinstance(value, list) and len(value) <= MAX_RANKS
          and all(type(r) is int and 0 <= r < MAX_RANKS for r in value))
    return None if ok else "a list of ranks"


def _object(value: Any) -> str | None:
    return None if isinstance(value, dict) else "an object"


def _objects(value: Any) -> str | None:
    return None if isinstance(value, list) and all(isinstance(v, dict) for v in value) else "a list of objects"


_INT64 = (1 << 63) - 1

TOP: dict[str, Check] = {
    "session_id": _string,
    "script": _string,
    "argv": _strings,
    "created": _time,
    "nproc_per_node": _integer(1, MAX_RANKS),
    "finished": _flag,
    "exit_code": _optional(_integer(-_INT64, _INT64)),
    "exit_reason": _string,
    "job": _object,
    "diagnosis": _optional(_object),
    "recommendations": _optional(_objects),
    "imported": _object,
    "store_error": _object,
    "in_process": _object,  # an in-process session's {pid, name} (advisor/hosted.py)
}

JOB: dict[str, Check] = {
    "id": _optional(_string),
    "token": _optional(_string),
    "launcher": _string,
    "id_source": _optional(_string),
    "hostname": _optional(_string),
    "world_size": _optional(_integer(1, MAX_RANKS)),
    "ranks_hosted": _ranks,
    "node_rank": _optional(_integer(0, MAX_RANKS)),
    "decides": _optional(_flag),
}


def check_meta(meta: dict[str, Any], path: Path) -> dict[str, Any]:
    """``meta`` as it is when every key a reader uses has its type; else ``SessionError``."""
    for table, where, data in ((TOP, "", meta), (JOB, "job.", meta.get("job") or {})):
        for key, check in table.items():
            if key in data:
                expected = check(data[key])
                if expected is not None:
                    raise SessionError(
                        f"{path}: its metadata {where}{key} is {_shown(data[key])}, not {expected}",
                        hint="the session file was changed or damaged; `advisor sessions` lists the others")
    return meta


def _shown(value: Any) -> str:
    """A short, safe rendering (never the repr of a nested or huge value)."""
    if isinstance(value, (dict, list)):
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value)}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 64:
        return "a too large integer"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
