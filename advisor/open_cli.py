"""``advisor open SESSION``: browse a recorded session in the TUI, read-only."""

from __future__ import annotations

import sys

from advisor import tui  # its package defers textual until make_app is used
from advisor.errors import UsageError
from advisor.paths import resolve_session
from advisor.tui.recorded_source import RecordedSource


def run_open(ref: str, *, budget_bytes: int | None = None) -> int:
    db_path = resolve_session(ref)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("advisor open needs a terminal (stdin or stdout is not a TTY)",
                         hint=f"`advisor report {ref}` prints the same session as text or JSON")
    source = RecordedSource.open(db_path)
    app = tui.make_app(source, title="advisor · recorded", budget_bytes=budget_bytes)
    app.run()
    return 0
