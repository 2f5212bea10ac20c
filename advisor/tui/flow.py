"""Text that wraps between fields, never inside one: a figure such as ``4.10 MiB`` stays whole.

A rich ``Text`` wraps at any space, so at 80 columns ``budget 23.5 GiB`` could end a line with
``23.5`` and start the next with ``GiB``. A ``Flow`` holds lines of fields instead and packs the
fields of each line into the width it has, again on every resize.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

from advisor.rich_text import name_text

Field = Text | str
SEP = "   "


def pack(lines: Sequence[Sequence[Field]], width: int, *, sep: str = SEP, indent: str = "") -> Text:
    """Each line's fields joined by ``sep``, wrapped between fields to ``width`` cells; a wrapped
    line continues after ``indent``. A field wider than the whole width is cut with an ellipsis."""
    out = Text()
    for number, fields in enumerate(lines):
        if number:
            out.append("\n")
        used = 0
        for field in fields:
            piece = field if isinstance(field, Text) else name_text(field)  # never markup, no control codes
            if not piece.plain:
                continue
            size = piece.cell_len
            if used and width > 0 and used + len(sep) + size > width:
                out.append("\n" + indent)
                used = len(indent)
            elif used:
                out.append(sep)
                used += len(sep)
            if width > 0 and used + size > width:
                piece = piece.copy()
                piece.truncate(max(width - used, 1), overflow="ellipsis")
                size = piece.cell_len
            out.append_text(piece)
            used += size
    return out


def labelled(label: str, value: Field, *, style: str = "") -> Text:
    """One field: a dim label and its value, ``budget 23.5 GiB``."""
    text = Text()
    text.append(f"{label} ", style="dim")
    if isinstance(value, Text):
        text.append_text(value)
    else:
        text.append_text(name_text(value, style))
    return text


class Flow(Static):
    """A ``Static`` whose lines of fields are packed to its width, never splitting a field."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("", id=id, classes=classes)
        self._lines: list[list[Field]] = []

    def set_lines(self, lines: Sequence[Sequence[Field]]) -> None:
        self._lines = [list(line) for line in lines]
        self._pack()

    @property
    def plain(self) -> str:
        """Every field in order, one line per line of fields (what a test reads, at any width)."""
        return "\n".join(SEP.join(f.plain if isinstance(f, Text) else f for f in line) for line in self._lines)

    def on_resize(self) -> None:
        self._pack()

    def _pack(self) -> None:
        self.update(pack(self._lines, self.content_region.width or self.size.width))
