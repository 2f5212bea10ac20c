"""Ranks: per-rank step time and peak; Enter on a rank shows it in every view."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.rich_text import name_text
from advisor.tui.format import fmt_loss
from advisor.tui.view_model import ViewModel


class RanksView(Vertical):
    DEFAULT_CSS = """
    RanksView > #ranks-help { height: auto; padding: 0 1; }
    RanksView > #ranks-table { height: 1fr; }
    """

    class Chosen(Message):
        """The user chose a rank for every view."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def compose(self) -> ComposeResult:
        yield Static(Text("Enter shows the rank under the cursor in every view; [ and ] step through ranks "
                          "anywhere.", style="dim"), id="ranks-help")
        yield DataTable(id="ranks-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one("#ranks-table", DataTable)
        for label in ("rank", "steps", "median step", "peak memory", "exposed comm", "last loss", "", "exit"):
            table.add_column(label, key=label or "mark")
        self._ranks: list[int] = []

    def update_model(self, model: ViewModel) -> None:
        table = self.query_one("#ranks-table", DataTable)
        table.clear()
        self._ranks = [r.rank for r in model.ranks]
        for row in model.ranks:
            marks = []
            if row.rank == model.slowest_rank and len(model.ranks) > 1:
                marks.append("slowest")
            if row.rank == model.rank:
                marks.append("shown")
            table.add_row(str(row.rank), str(row.steps), fmt_seconds(row.median_step_s), fmt_bytes(row.peak_bytes),
                          fmt_seconds(row.exposed_comm_s), fmt_loss(row.last_loss), ", ".join(marks), name_text(row.exit or ""),
                          key=str(row.rank))
        if model.rank in self._ranks:
            table.move_cursor(row=self._ranks.index(model.rank))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if 0 <= event.cursor_row < len(self._ranks):
            self.post_message(self.Chosen(self._ranks[event.cursor_row]))
