"""``q`` while the job runs: stop the training, or leave it running and recorded."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

STOP = "stop"  # stop the training job (SIGTERM to it), then write its report
LEAVE = "leave"  # close the UI; the job trains on and the advisor keeps recording it


class QuitScreen(ModalScreen[str | None]):
    """Dismisses with STOP, LEAVE, or None (Escape: back to the UI)."""

    DEFAULT_CSS = """
    QuitScreen { align: center middle; }
    QuitScreen > Vertical { width: 74; height: auto; border: thick $warning; padding: 1 2; background: $surface; }
    """
    BINDINGS = [
        Binding("s", "answer('stop')", "Stop training"),
        Binding("l", "answer('leave')", "Leave it running"),
        Binding("escape", "answer(None)", "Back"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(
                "Training is still running.\n\n"
                "[b]s[/b]  stop the training: the script gets SIGTERM (SIGKILL 30 s later), and the report is written\n"
                "[b]l[/b]  leave it running: the UI closes, the advisor keeps recording the job in its session "
                "and prints progress here until it ends (Ctrl-C then stops the script)\n"
                "[b]Escape[/b]  back", id="quit-text")

    def action_answer(self, value: str | None) -> None:
        self.dismiss(value)
