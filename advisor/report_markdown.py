"""The report as Markdown (``--format markdown``): for CI logs, pull requests and issues.

The same sections, figures and units as the rich report: both render the blocks of
``advisor.report_blocks``. Names are never cut, and text from the user's program is escaped, so
``__init__``, ``<lambda>`` or ``[/]`` show as they are once GitHub renders the page.
"""

from __future__ import annotations

import re
from typing import Any

from advisor.blocks import Block, Cell, Facts, Table, cell_lines, cell_text
from advisor.records.units import plain_text
from advisor.report_blocks import report_sections

# Characters Markdown would read as syntax. An underscore only where it may open or close
# emphasis (at a word's edge): ``optimizer_state`` stays readable in a raw CI log.
_ACTIVE = re.compile(r"([\\`*\[\]<>|~])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def md_text(value: object) -> str:
    """``value`` as Markdown text that renders as it is: control sequences stripped, syntax escaped."""
    return _ACTIVE.sub(lambda m: "\\" + m.group(0), plain_text(value))


def _cell(cell: Cell) -> str:
    # A cell's lines (a regime's top ops) join with <br>, the only line break a table has.
    return "<br>".join(md_text(line) for line in cell_lines(cell))


def _table(block: Table) -> list[str]:
    lines = [f"## {md_text(block.title)}", ""]
    lines.append("| " + " | ".join(md_text(c.name) or " " for c in block.columns) + " |")
    lines.append("|" + "".join("---:|" if c.numeric else "---|" for c in block.columns))
    for row in block.rows:
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines.append("")
    if block.caption:
        lines += [md_text(block.caption), ""]
    return lines


def _facts(block: Facts, *, heading: str = "##") -> list[str]:
    lines = [f"{heading} {md_text(block.title)}", ""]
    for label, value in block.items:
        text = cell_text(value)
        if label:
            lines.append(f"- **{md_text(label)}** {md_text(text)}")
        else:
            lines.append(f"- {md_text(text.strip())}")
    return lines + [""]


def block_markdown(block: Block) -> list[str]:
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Facts):
        return _facts(block)
    lines = [f"## {md_text(block.title)}", ""] if block.title else []
    for line in block.lines:
        lines += ["".join(md_text(cell_text(piece)) for piece in line), ""]
    return lines


def report_markdown(report: dict[str, Any], *, top: int = 10) -> str:
    out: list[str] = []
    for i, section in enumerate(report_sections(report, top=top)):
        for block in section.blocks:
            if i == 0 and isinstance(block, Facts):  # the run: the document's title
                out += _facts(block, heading="# advisor report:")
            else:
                out += block_markdown(block)
    return "\n".join(out).rstrip() + "\n"
