"""The OOM flight recorder: what was happening when memory ran out, captured before the process dies."""

from __future__ import annotations

import os
import re
import tempfile
import traceback
from types import TracebackType
from typing import Any, Callable

import torch

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_PROBES_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REQUEST = re.compile(r"Tried to allocate ([0-9.]+) ?(B|bytes|KiB|MiB|GiB|TiB)")
_SCALE = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
MAX_FRAMES = 30


def _is_user_file(filename: str) -> bool:
    path = os.path.abspath(filename)
    return not (
        path.startswith(_TORCH_DIR)
        or path.startswith(_PROBES_DIR)
        or filename.startswith("<")  # <frozen runpy>, <string>
    )


def user_frames(summary: traceback.StackSummary) -> list[dict[str, Any]]:
    """Frames outside torch and the agent, innermost last, as {"file", "line", "function", "code"}."""
    frames = [
        {"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line or ""}
        for f in summary
        if _is_user_file(f.filename)
    ]
    return frames[-MAX_FRAMES:]


def requested_bytes_from_message(message: str) -> int | None:
    """The size in CUDA's "Tried to allocate 2.00 GiB" message, in bytes, or None."""
    match = _REQUEST.search(message)
    if match is None:
        return None
    return int(float(match.group(1)) * _SCALE[match.group(2)])


def module_from_traceback(
    tb: TracebackType | None, name_of: Callable[[torch.nn.Module], str | None]
) -> str | None:
    """Innermost ``forward`` on the traceback whose ``self`` is a named module."""
    found: str | None = None
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module):
            name = name_of(owner)
            if name is not None:
                found = name
        tb = tb.tb_next
    return found


def is_oom(exc: BaseException) -> bool:
    """``torch.OutOfMemoryError`` (which ``torch.cuda.OutOfMemoryError`` is), or a
    ``RuntimeError`` carrying an allocator's out-of-memory message."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def session_folder() -> str:
    """Where the OOM snapshot goes: the session folder the controller named
    (``ADVISOR_SESSION_DIR``, set for every training process it starts), else a temp dir."""
    return os.environ.get("ADVISOR_SESSION_DIR") or tempfile.gettempdir()
