"""A table that fits its width: columns drop by priority, names shorten, figures stay whole.

Each column says how soon it may go (``drop``: 0 never, higher first) and whether it is a name
that may be shortened with an ellipsis (``flex``). On every resize the table shows the columns
that fit at their full width, figures never cut; a note under it names the columns hidden,
and ``f`` opens the whole table in a screen of its own (scrolling sideways where it must).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Static

from advisor.rich_text import name_text

Cell = str | Text


@dataclass(frozen=True, kw_only=True)
class Column:
    key: str
    label: str
    drop: int = 0  # 0: always shown; columns with a higher number are left out first
    flex: bool = False  # a name: shortened with an ellipsis (to min_width) before any column drops
    min_width: int = 12


def cell_width(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else Text(cell).cell_len


def fit_columns(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int, *,
                padding: int = 1) -> tuple[list[int], dict[int, int]]:
    """Which columns fit in ``width`` cells (their indexes, in order) and the width of each.

    Names shrink first (to their ``min_width``), then columns drop, highest ``drop`` first (the
    rightmost of equals), then names grow back into the room left. ``width`` <= 0: all of them."""
    natural = {i: max([cell_width(c.label)] + [cell_width(r[i]) for r in rows if i < len(r)])
               for i, c in enumerate(columns)}
    widths = dict(natural)
    shown = list(range(len(columns)))
    if width <= 0:
        return shown, widths

    def total() -> int:
        return sum(widths[i] + 2 * padding for i in shown)

    for i in shown:
        if columns[i].flex and total() > width:
            widths[i] = max(min(columns[i].min_width, natural[i]), widths[i] - (total() - width))
    while total() > width:
        droppable = [i for i in shown if columns[i].drop > 0]
        if not droppable:
            break
        shown.remove(max(droppable, key=lambda i: (columns[i].drop, i)))
    room = width - total()
    for i in shown:
        if columns[i].flex and room > 0:
            grow = min(room, natural[i] - widths[i])
            widths[i] += grow
            room -= grow
    return shown, widths


def _shorten(cell: Cell, width: int) -> Cell:
    if cell_width(cell) <= width:
        return cell
    text = cell.copy() if isinstance(cell, Text) else Text(cell)
    text.truncate(width, overflow="ellipsis")
    return text


class FitTable(DataTable[Cell]):
    """``set_rows(rows)`` with every column's cell; the table shows what fits (see the module)."""

    BINDINGS = [Binding("f", "full_table", "Full table", show=False)]

    def __init__(self, columns: Sequence[Column], *, title: str, id: str | None = None,
                 cursor_type: str = "row", zebra_stripes: bool = True) -> None:
        super().__init__(id=id, cursor_type=cursor_type, zebra_stripes=zebra_stripes)  # type: ignore[arg-type]
        self.columns_all = list(columns)
        self.table_title = title
        self.full_rows: list[list[Cell]] = []
        self._keys: list[str | None] = []
        self.hidden: list[str] = []
        self._layout: tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | None = None
        self.note = Static("", classes="fit-note")  # yield it under the table: names what is left out
        self.note.display = False

    def set_columns(self, columns: Sequence[Column]) -> None:
        """New columns; rows made for other columns are let go (``set_rows`` brings the new ones)."""
        if [(c.key, c.label) for c in columns] != [(c.key, c.label) for c in self.columns_all]:
            self.full_rows, self._keys = [], []
        self.columns_all = list(columns)
        self._layout = None
        self._fill()

    def set_rows(self, rows: Sequence[Sequence[Cell]], keys: Sequence[str | None] | None = None) -> None:
        # A ``str`` cell in a DataTable is parsed as markup: a module named ``[/]`` would stop the
        # view. Every plain string becomes text here, once, whoever built the row.
        self.full_rows = [[c if isinstance(c, Text) else name_text(c) for c in r] for r in rows]
        for row in self.full_rows:
            if len(row) != len(self.columns_all):
                raise ValueError(f"{self.id}: a row of {len(row)} cells for {len(self.columns_all)} columns")
        self._keys = list(keys) if keys is not None else [None] * len(self.full_rows)
        self._fill()

    def on_resize(self) -> None:
        self._fill()

    def _available(self) -> int:
        width = self.size.width
        if width and len(self.full_rows) + 1 > self.size.height:
            width -= self.styles.scrollbar_size_vertical  # a vertical scrollbar takes its share
        return width

    def _fill(self) -> None:
        shown, widths = fit_columns(self.columns_all, self.full_rows, self._available(), padding=self.cell_padding)
        layout = (tuple(shown), tuple((i, widths[i]) for i in shown))
        row, scroll = self.cursor_row, self.scroll_y
        if layout != self._layout:
            self.clear(columns=True)
            for i in shown:
                column = self.columns_all[i]
                self.add_column(column.label, key=column.key, width=widths[i])
            self._layout = layout
        else:
            self.clear()
        for cells, key in zip(self.full_rows, self._keys):
            self.add_row(*(_shorten(cells[i], widths[i]) if self.columns_all[i].flex else cells[i] for i in shown),
                         key=key)
        if self.row_count:
            self.move_cursor(row=min(max(row, 0), self.row_count - 1), animate=False, scroll=False)
            self.scroll_y = scroll
        self.hidden = [self.columns_all[i].label for i in range(len(self.columns_all)) if i not in shown]
        self.note.update(Text(f"hidden at this width: {', '.join(self.hidden)} · f shows all columns", style="dim"))
        self.note.display = bool(self.hidden) and bool(self.full_rows)

    def action_full_table(self) -> None:
        self.app.push_screen(FullTableScreen(self.table_title, self.columns_all, self.full_rows))


class FullTableScreen(ModalScreen[None]):
    """One table with every column, over the whole screen; Escape goes back."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("f", "app.pop_screen", "Back", show=False)]
    DEFAULT_CSS = """
    FullTableScreen { background: $background; }
    FullTableScreen > Vertical { height: 1fr; }
    FullTableScreen #full-title { height: 1; padding: 0 1; text-style: bold; }
    FullTableScreen DataTable { height: 1fr; }
    """

    def __init__(self, title: str, columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> None:
        super().__init__()
        self.table_title = title
        self.columns = list(columns)
        self.rows = [list(r) for r in rows]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"{self.table_title}: every column (scroll sideways with ← →)", id="full-title")
            yield DataTable(id="full-table", cursor_type="row", zebra_stripes=True)
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for column in self.columns:
            table.add_column(column.label, key=column.key)
        for row in self.rows:
            table.add_row(*row)
        table.focus()
