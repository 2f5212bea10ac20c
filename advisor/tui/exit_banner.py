"""Why training ended: the reason, the exit code, and per rank the exception and where it was raised."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from advisor.state import SessionState
from advisor.records.samples import ExitInfo
from advisor.tui.views.output import output_text

OUTPUT_LINES = 6  # the script's last lines when no rank reported an exception: its own last words
OUTPUT_LINES_OK = 3  # after a clean end: the script's last lines (its final loss, say)


def exit_text(state: SessionState, *, short: bool = False) -> Text:
    """What a person needs to know first when the job is gone; empty while it runs. ``short``
    (a short terminal): the reason, then an exception or the script's last line, in two lines."""
    if not state.finished:
        return Text()
    if short:
        return _short_text(state)
    failed = bool(state.exit_code) or any(e.exc_type for e in state.exits.values())
    reason = state.exit_reason or _first_reason(state) or ("failed" if failed else "completed")
    text = Text()
    text.append("Training ended: ", style="bold")
    text.append(reason, style="bold red" if failed else "bold green")
    if state.exit_code is not None:
        text.append(f" (exit code {state.exit_code})")
    else:
        text.append(" (still running or interrupted: no exit recorded)")
    steps = state.latest_step() + 1
    if steps:
        text.append(f" after {steps} step{'s' if steps != 1 else ''}", style="dim")
    many = len(state.exits) > 1
    for rank in sorted(state.exits):
        info = state.exits[rank]
        if info.exc_type or info.message:
            text.append("\n")
            text.append_text(_exception(info, show_rank=many))
    if state.output_tail:
        count = OUTPUT_LINES if failed and not any(e.exc_type for e in state.exits.values()) else OUTPUT_LINES_OK
        text.append("\nthe script's last output (8 shows it all):", style="dim")
        for line in state.output_tail[-count:]:
            text.append("\n  ")
            text.append_text(_line(line))
    text.append("\nEverything measured stays on screen; press q to quit.", style="italic")
    return text


def _line(line: str) -> Text:
    """One line of the script's output, colours kept, on one row."""
    text = output_text(line)
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def _short_text(state: SessionState) -> Text:
    failed = bool(state.exit_code) or any(e.exc_type for e in state.exits.values())
    text = Text()
    text.append("Training ended: ", style="bold")
    text.append(state.exit_reason or _first_reason(state) or ("failed" if failed else "completed"),
                style="bold red" if failed else "bold green")
    if state.exit_code is not None:
        text.append(f" (exit code {state.exit_code})")
    steps = state.latest_step() + 1
    if steps:
        text.append(f" after {steps} step{'s' if steps != 1 else ''}", style="dim")
    text.append(" · q quits", style="italic")
    raised = next((e for _, e in sorted(state.exits.items()) if e.exc_type), None)
    if raised is not None:
        text.append("\n")
        if len(state.exits) > 1:
            text.append(f"rank {raised.rank}: ", style="bold")
        text.append(raised.exc_type or "error", style="bold red")
        if raised.message:
            text.append(f": {raised.message}")
    elif state.output_tail:
        text.append("\nlast output: ", style="dim")
        text.append_text(_line(state.output_tail[-1]))
    return text


def _first_reason(state: SessionState) -> str:
    return next((e.reason for _, e in sorted(state.exits.items()) if e.reason), "")


def _exception(info: ExitInfo, *, show_rank: bool) -> Text:
    text = Text()
    if show_rank:
        text.append(f"rank {info.rank}: ", style="bold")
    text.append(info.exc_type or "error", style="bold red")
    if info.message:
        text.append(f": {info.message}")
    frame = info.frame or {}
    if frame.get("file"):
        text.append(f"\n  at {frame['file']}:{frame.get('line', '?')}")
        if frame.get("function"):
            text.append(f" in {frame['function']}")
        if frame.get("code"):
            text.append(f"\n    {str(frame['code']).strip()}", style="yellow")
    return text


class ExitBanner(Static):
    """Hidden while training runs; once it ends, says why, above everything else."""

    DEFAULT_CSS = """
    ExitBanner { height: auto; max-height: 16; padding: 0 1; border: heavy $error; display: none; }
    ExitBanner.-completed { border: heavy $success; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.border_title = "Training ended"

    @property
    def plain(self) -> str:
        return str(self.content)

    def update_state(self, state: SessionState) -> None:
        if not state.finished:
            self.display = False
            return
        self.update(exit_text(state, short=self.app.has_class("-short")))
        ok = not state.exit_code and not any(e.exc_type for e in state.exits.values())
        self.set_class(ok, "-completed")
        self.display = True
