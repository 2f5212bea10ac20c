"""The TUI's ``Source`` over a recorded session (``advisor open``): read-only, advice on demand."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

from advisor.advice import advise_state
from advisor.output_tail import OUTPUT_LOG, read_tail
from advisor.state import OUTPUT_KEEP, SessionState
from advisor.store import load_state  # the source reads SQLite; the views never do
from advisor.tui.view_model import advice_budget

READ_ONLY = ("this is a recorded session (read-only): nothing runs to apply to; press p to write the "
             "remedy to a plan file, then `advisor attach --plan FILE SCRIPT`")


class RecordedSource:
    """Implements ``advisor.state.Source`` over a finished ``SessionState``."""

    read_only = True

    def __init__(self, state: SessionState, *, db_path: Path | None = None) -> None:
        self._state = state
        self._lock = threading.Lock()
        self.db_path = db_path
        self.budget_bytes: int | None = None  # the budget the advice was last computed at (None: recorded)
        self.version = 0

    @classmethod
    def open(cls, db_path: Path) -> RecordedSource:
        state = load_state(db_path)
        output = db_path.parent / OUTPUT_LOG  # the script's output, when it ran under the TUI
        if output.exists():
            lines = read_tail(output)
            state = _with(state, output_tail=lines[-OUTPUT_KEEP:], output_lines=len(lines))
        return cls(state, db_path=db_path)

    def snapshot(self) -> SessionState:
        with self._lock:
            return self._state

    def readvise(self, budget_bytes: int | None) -> int:
        """Recompute the diagnosis and recommendations at ``budget_bytes``; how many remedies."""
        with self._lock:
            state = self._state
        # At the budget `advisor report` uses unless the user set one (b): the same advice.
        diagnosis, recommendations = advise_state(state, budget_bytes=advice_budget(state, budget_bytes))
        with self._lock:
            self._state = _with(state, diagnosis=diagnosis, recommendations=recommendations)
            self.budget_bytes = budget_bytes
            self.version += 1
        return len(recommendations)

    def apply(self, recommendation_id: str, *, confirmed: bool = False) -> str | None:
        return READ_ONLY

    def revert(self) -> str | None:
        return READ_ONLY

    def stop(self) -> None:
        """Nothing to stop: the job ended long ago."""


def _with(state: SessionState, **changes: object) -> SessionState:
    out = copy.copy(state)
    for key, value in changes.items():
        setattr(out, key, value)
    return out
