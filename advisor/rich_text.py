"""Blocks (``advisor.blocks``) as rich renderables, and the one way a user-derived string
becomes rich text.

Every string that comes from the user's program (a module or op name, a script path, an
exception's message) goes through ``name_text``: control sequences stripped
(``plain_text``), and a ``Text`` rather than a ``str``, so rich and Textual never parse it as
markup. A ``str`` cell in a rich table or a Textual ``DataTable`` *is* parsed: a module named
``[/]`` stopped ``advisor attach`` with a ``MarkupError``, and ``fwd [rank 0]`` printed as
``fwd``.
"""

from __future__ import annotations

from typing import Any

from rich.panel import Panel
from rich.table import Table as RichTable
from rich.text import Text

from advisor.blocks import Block, Cell, Facts, Lines, Span, Table, cell_lines
from advisor.records.units import plain_text


def name_text(value: object, style: str = "", *, one_line: bool = True) -> Text:
    """``value`` as rich text shown as it is: the TUI's and the reports' cell for any name."""
    return Text(plain_text(value, one_line=one_line), style=style)


def cell_renderable(cell: Cell) -> Text:
    """A block's cell as text: each of its lines cleaned as one line (``plain_text``)."""
    if isinstance(cell, Span):
        return name_text(cell.text, cell.style)
    if isinstance(cell, tuple):
        return Text("\n").join(name_text(line) for line in cell)
    return name_text(cell)


def _table(block: Table) -> RichTable:
    table = RichTable(title=name_text(block.title), caption=name_text(block.caption) if block.caption else None,
                      expand=False)
    for i, column in enumerate(block.columns):
        longest = max((len(line) for row in block.rows if i < len(row) for line in cell_lines(row[i])), default=0)
        table.add_column(name_text(column.name), justify="right" if column.numeric else "left",
                         no_wrap=column.numeric or column.label, overflow="fold",
                         min_width=min(longest, column.fold_at) if column.fold_at else None)
    for row in block.rows:
        table.add_row(*(cell_renderable(c) for c in row))
    return table


def _facts(block: Facts) -> Panel:
    text = Text()
    for i, (label, value) in enumerate(block.items):
        if i:
            text.append("\n")
        if label:
            text.append(plain_text(label), style="bold")
            text.append(" ")
        text.append_text(cell_renderable(value))
    return Panel(text, title=name_text(block.title), expand=False, border_style=block.border or "none")


def _lines(block: Lines) -> Text:
    text = Text()
    if block.title:
        text.append(plain_text(block.title), style="bold")
    for line in block.lines:
        if len(text):
            text.append("\n")
        for piece in line:
            text.append_text(cell_renderable(piece))
    return text


def to_rich(block: Block) -> Any:
    """The rich renderable of one block."""
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Facts):
        return _facts(block)
    return _lines(block)


def text_cells(*cells: object) -> tuple[Any, ...]:
    """Table cells for a Textual ``DataTable`` or a rich ``Table``: every ``str`` becomes
    ``name_text`` (a ``str`` cell is parsed as markup there), anything else (already ``Text``,
    or a renderable) is kept."""
    return tuple(name_text(c) if isinstance(c, str) else c for c in cells)
