"""Output: the script's own stdout and stderr as it runs, scrollable.

Under the TUI the script writes to ``output.log`` in the session folder; the controller follows
that file into the state (advisor/output_tail.py), which keeps the newest lines. This view
appends what is new at each redraw and says where the whole output is.
"""

from __future__ import annotations

import re
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import RichLog, Static

from advisor.output_tail import OUTPUT_LOG
from advisor.state import OUTPUT_KEEP, SessionState


_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")  # a terminal's title and the like: not text
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f]")  # control characters but ESC (colours)


def output_text(line: str) -> Text:
    """One line of the script's output as the terminal would show its text: colours kept, tabs
    expanded, other control sequences dropped."""
    return Text.from_ansi(_CONTROL.sub("", _OSC.sub("", line)).expandtabs())


def output_file(state: SessionState) -> str | None:
    """Where the whole output is: ``output.log`` in the session folder, when there is one."""
    if not state.session_path:
        return None
    path = Path(state.session_path) / OUTPUT_LOG
    return str(path) if path.exists() else None


def where_text(state: SessionState) -> Text:
    """The line above the output: how much there is and where all of it is."""
    text = Text()
    shown = min(state.output_lines, len(state.output_tail))
    path = output_file(state)
    if not state.output_lines:
        if path is None and state.finished:
            text.append("no output recorded for this session (headless, the script's output went to its own "
                        "terminal)", style="dim")
        else:
            text.append("no output from the script yet" if not state.finished else "the script printed nothing",
                        style="dim")
    else:
        text.append(f"{state.output_lines} line{'s' if state.output_lines != 1 else ''}", style="bold")
        if shown < state.output_lines:
            text.append(f" (the last {shown} here)")
    if path:
        text.append(" · all of it: ", style="dim")
        text.append(path)
    return text


class OutputView(Vertical):
    DEFAULT_CSS = """
    OutputView > #output-where { height: auto; padding: 0 1; }
    OutputView > #output-log { height: 1fr; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._seen = 0  # state.output_lines already written to the log

    def compose(self) -> ComposeResult:
        yield Static(Text("no output from the script yet", style="dim"), id="output-where")
        yield RichLog(id="output-log", max_lines=OUTPUT_KEEP, wrap=True, markup=False, highlight=False,
                      auto_scroll=True)

    @property
    def lines(self) -> list[str]:
        """The lines in the log now, as plain text (what a test reads)."""
        return [strip.text for strip in self.query_one(RichLog).lines]

    def update_state(self, state: SessionState) -> None:
        self.query_one("#output-where", Static).update(where_text(state))
        new = state.output_lines - self._seen
        if new <= 0:
            return
        log = self.query_one(RichLog)
        if new > len(state.output_tail):  # more arrived than the state keeps: start from what it has
            log.clear()
            new = len(state.output_tail)
        for line in state.output_tail[len(state.output_tail) - new:]:
            log.write(output_text(line), scroll_end=None)
        self._seen = state.output_lines

    def update_model(self, model: object) -> None:
        """The output comes from the state at each redraw (``update_state``), not from the model."""
