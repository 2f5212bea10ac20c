"""Events: warnings, disabled probes, applies, reverts, OOMs, rank exits, and the script's last lines."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from advisor.rich_text import name_text
from advisor.tui.view_model import ViewModel

KIND_STYLE = {"warning": "yellow", "probe": "yellow", "oom": "bold red", "apply": "green", "revert": "cyan",
              "exit": "bold"}


class EventsView(Vertical):
    DEFAULT_CSS = """
    EventsView > #events-table { height: 1fr; }
    EventsView > #output-tail { height: auto; max-height: 10; border-top: solid $secondary; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield DataTable(id="events-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="output-tail")

    def on_mount(self) -> None:
        table = self.query_one("#events-table", DataTable)
        for label in ("step", "rank", "kind", "what"):
            table.add_column(label, key=label)

    @property
    def output_plain(self) -> str:
        return str(self.query_one("#output-tail", Static).content)

    def update_model(self, model: ViewModel) -> None:
        table = self.query_one("#events-table", DataTable)
        table.clear()
        for row in reversed(model.events):  # newest first
            table.add_row("" if row.step is None else str(row.step), "" if row.rank is None else str(row.rank),
                          Text(row.kind, style=KIND_STYLE.get(row.kind, "")), name_text(row.text))
        tail = Text("script output (last lines)\n", style="dim")
        tail.append("\n".join(model.output_tail[-8:]) if model.output_tail else "none captured")
        self.query_one("#output-tail", Static).update(tail)
