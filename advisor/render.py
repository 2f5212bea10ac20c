"""The rich rendering of a report (``advisor report``, end of ``attach --headless``)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from rich.console import Console, Group

from advisor.phrases import exit_line  # noqa: F401 - callers' name
from advisor.report_blocks import exit_sections, report_sections
from advisor.report_markdown import report_markdown
from advisor.rich_text import to_rich


def report_renderables(report: dict[str, Any]) -> list[Any]:
    """The rich renderables of every section (``advisor.report_blocks``), as Markdown shows them."""
    return [to_rich(block) for section in report_sections(report) for block in section.blocks]


PIPE_WIDTH = 120  # a CI log or a pipe has no width; wide enough that names are never squeezed


def report_console(stream: TextIO) -> Console:
    """A console for ``stream``: its own width on a terminal, else ``COLUMNS`` but at least 120
    (CI runners often say 80, which would squeeze op and module names)."""
    if stream.isatty():
        return Console(file=stream)
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        width = 0
    return Console(file=stream, width=max(width, PIPE_WIDTH), color_system=None)


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    (console or report_console(sys.stdout)).print(Group(*report_renderables(report)))


def emit_report(report: dict[str, Any], fmt: str, stream: TextIO) -> None:
    """The whole report on ``stream`` as ``text`` (rich), ``json`` or ``markdown``."""
    if fmt == "json":
        json.dump(report, stream, indent=1, allow_nan=False, default=str)
        stream.write("\n")
    elif fmt == "markdown":
        stream.write(report_markdown(report))
    else:
        print_report(report, report_console(stream))
    stream.flush()


def print_exit_summary(report: dict[str, Any], console: Console | None = None) -> None:
    """After the TUI closes: the run panel and the diagnosis only."""
    parts = [to_rich(block) for section in exit_sections(report) for block in section.blocks]
    (console or report_console(sys.stderr)).print(Group(*parts))
