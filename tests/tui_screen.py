"""What a person reads: the app's screen as plain text, and checks that figures are whole on it."""

from __future__ import annotations

import io

from rich.console import Console
from textual.app import App

from advisor.tui.fit_table import FitTable


def screen_text(app: App) -> str:
    """The current screen, every cell, as lines of text (as ``export_screenshot`` draws it)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def footer_line(app: App) -> str:
    return screen_text(app).rstrip("\n").splitlines()[-1]


def cut_figures(app: App) -> list[str]:
    """Cells of the visible tables' figure columns (every column but names) that are not whole on
    screen: a figure cut at a column's edge or the terminal's."""
    text = screen_text(app)
    missing = []
    for table in app.screen.query(FitTable):
        if not table.display or not table.region.height:
            continue
        shown = [c for c in table.columns_all if c.label not in table.hidden]
        first = int(table.scroll_y)
        for row in table.full_rows[first:first + max(table.region.height - 1, 0)]:
            for column, cell in zip(table.columns_all, row):
                value = str(cell)
                if column in shown and not column.flex and value and value not in text:
                    missing.append(f"{table.id}.{column.key}: {value!r}")
    return missing
