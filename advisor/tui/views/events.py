"""Events: warnings, disabled probes, applies, reverts, OOMs and rank exits, newest first (the
script's own output has a view of its own, advisor/tui/views/output.py)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from advisor.tui.fit_table import Column, FitTable
from advisor.tui.view_model import ViewModel

EVENT_COLUMNS = [Column(key="step", label="step", drop=1), Column(key="rank", label="rank", drop=2),
                 Column(key="kind", label="kind"), Column(key="what", label="what", flex=True, min_width=20)]

KIND_STYLE = {"warning": "yellow", "probe": "yellow", "oom": "bold red", "apply": "green", "revert": "cyan",
              "exit": "bold"}


class EventsView(Vertical):
    DEFAULT_CSS = """
    EventsView > #events-table { height: 1fr; }
    EventsView > .fit-note { height: 1; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        table = FitTable(EVENT_COLUMNS, title="events", id="events-table")
        yield table
        yield table.note

    def update_model(self, model: ViewModel) -> None:
        self.query_one(FitTable).set_rows([
            ["" if row.step is None else str(row.step), "" if row.rank is None else str(row.rank),
             Text(row.kind, style=KIND_STYLE.get(row.kind, "")), row.text]
            for row in reversed(model.events)])  # newest first
