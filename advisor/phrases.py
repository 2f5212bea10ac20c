"""Sentences more than one surface prints the same way (the rich report, Markdown, the TUI)."""

from __future__ import annotations

from typing import Any


def exit_line(exit_: dict[str, Any]) -> str:
    """``code 0 · completed``; a session with no exit recorded says so instead of "code None"."""
    if exit_.get("code") is None:
        return "still running or interrupted: no exit recorded"
    return f"code {exit_['code']} · {exit_.get('reason') or ''}".rstrip(" ·")
