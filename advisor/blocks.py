"""The report's sections as plain blocks that every surface renders the same way.

Each section of a report (the run, the phases, memory, compute, communication, regimes, links,
the diagnosis with its recommendations and applied remedies, warnings) becomes a list of
blocks: a table, a panel of facts, or lines of text. The rich report (``advisor.rich_text``)
and the Markdown report (``advisor.report_markdown``) render the same blocks, so neither can
leave out a section the other shows, and every cell is text: a module named ``[/]`` is
printed as ``[/]``, never parsed as markup.

No rich, no torch: the figures are formatted here (``advisor.records.units``), the look
(borders, colours, widths) is the renderer's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


@dataclass(frozen=True, kw_only=True)
class Span:
    """Text with a style the rich renderer applies ("red", "bold", "dim"); Markdown drops it."""

    text: str
    style: str = ""


# A cell: a string (one line: a name's own line breaks become spaces), a styled span, or a tuple
# of strings shown one under another (a regime's top ops).
Cell = Union[str, Span, tuple[str, ...]]


@dataclass(frozen=True, kw_only=True)
class Column:
    """A table column: ``numeric`` ones are right-justified and never wrapped; a ``name`` column
    (op, module, type) folds a long name onto more lines of its cell, never cuts it, and is at
    least as wide as its longest name up to ``fold_at`` characters."""

    name: str
    numeric: bool = False
    label: bool = False  # a short word (a rank, a phase): left-justified, never wrapped
    fold_at: int | None = None


@dataclass(frozen=True, kw_only=True)
class Table:
    title: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]
    caption: str | None = None


@dataclass(frozen=True, kw_only=True)
class Facts:
    """A titled panel of lines, each ``(label, value)``: "script train.py" (``label`` "" for a line
    of its own). ``border``: the rich panel's border style (red for an out-of-memory record)."""

    title: str
    items: tuple[tuple[str, Cell], ...]
    border: str = ""


@dataclass(frozen=True, kw_only=True)
class Lines:
    """Lines of text under an optional heading (a summary line, a note, the warnings)."""

    lines: tuple[tuple[Cell, ...], ...]  # each line: its pieces, joined without separator
    title: str | None = None


Block = Union[Table, Facts, Lines]


@dataclass(frozen=True, kw_only=True)
class Section:
    """One section of the report: its name (for the rendering error line) and its blocks."""

    name: str
    blocks: tuple[Block, ...] = field(default_factory=tuple)


def cell_lines(cell: Cell) -> tuple[str, ...]:
    """A cell's lines: one, except for a tuple cell."""
    if isinstance(cell, tuple):
        return tuple(str(line) for line in cell)
    return (cell.text if isinstance(cell, Span) else str(cell),)


def cell_text(cell: Cell) -> str:
    return "\n".join(cell_lines(cell))


def titles(blocks: list[Block]) -> list[str]:
    """The titles of the blocks that have one, in order (tests compare surfaces with them)."""
    return [b.title for b in blocks if b.title]
