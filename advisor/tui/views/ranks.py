"""Ranks: per-rank step time and peak; Enter on a rank shows it in every view."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.tui.fit_table import Column, FitTable
from advisor.tui.format import fmt_loss
from advisor.tui.history import in_force_names
from advisor.tui.view_model import ViewModel

RANK_COLUMNS = [Column(key="rank", label="rank"), Column(key="steps", label="steps", drop=3),
                Column(key="median", label="median step"), Column(key="peak", label="peak memory"),
                Column(key="exposed", label="exposed comm", drop=4), Column(key="loss", label="last loss", drop=2),
                Column(key="mark", label="", drop=1), Column(key="exit", label="exit", drop=1, flex=True, min_width=10)]


class RanksView(Vertical):
    DEFAULT_CSS = """
    RanksView > #ranks-help { height: auto; padding: 0 1; }
    RanksView > #ranks-table { height: 1fr; }
    RanksView > .fit-note { height: 1; padding: 0 1; }
    """

    class Chosen(Message):
        """The user chose a rank for every view."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def compose(self) -> ComposeResult:
        yield Static(Text("Enter shows the rank under the cursor in every view; [ and ] step through ranks "
                          "anywhere.", style="dim"), id="ranks-help")
        table = FitTable(RANK_COLUMNS, title="ranks", id="ranks-table")
        yield table
        yield table.note

    def on_mount(self) -> None:
        self._ranks: list[int] = []

    def update_model(self, model: ViewModel) -> None:
        help_text = Text("Enter shows the rank under the cursor in every view; [ and ] step through ranks "
                         "anywhere.", style="dim")
        if model.regime_since is not None:
            help_text.append(f"\nMedian step and peak memory since step {model.regime_since}, the job as it is "
                             f"now (remedies in force: {', '.join(in_force_names(model.in_force)) or 'none'}).")
        self.query_one("#ranks-help", Static).update(help_text)
        table = self.query_one(FitTable)
        self._ranks = [r.rank for r in model.ranks]
        rows = []
        for row in model.ranks:
            marks = []
            if row.rank == model.slowest_rank and len(model.ranks) > 1:
                marks.append("slowest")
            if row.rank == model.rank:
                marks.append("shown")
            rows.append([str(row.rank), str(row.steps), fmt_seconds(row.median_step_s), fmt_bytes(row.peak_bytes),
                         fmt_seconds(row.exposed_comm_s), fmt_loss(row.last_loss), ", ".join(marks), row.exit or ""])
        table.set_rows(rows, keys=[str(r) for r in self._ranks])
        if model.rank in self._ranks:
            table.move_cursor(row=self._ranks.index(model.rank))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if 0 <= event.cursor_row < len(self._ranks):
            self.post_message(self.Chosen(self._ranks[event.cursor_row]))
