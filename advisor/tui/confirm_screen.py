"""A yes/no dialog before a remedy that changes numerics (apply class ``live-opt-in``) is applied."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from advisor.rich_text import name_text


class ConfirmApplyScreen(ModalScreen[bool]):
    """Dismisses with True on ``y``, False on ``n`` or Escape."""

    DEFAULT_CSS = """
    ConfirmApplyScreen { align: center middle; }
    ConfirmApplyScreen > Vertical { width: 72; height: auto; border: thick $warning; padding: 1 2;
                                    background: $surface; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", "Apply anyway"),
        Binding("n", "answer(False)", "Cancel"),
        Binding("escape", "answer(False)", "Cancel", show=False),
    ]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.title_text = title

    def compose(self) -> ComposeResult:
        with Vertical():
            text = name_text(self.title_text, "bold")  # a title holds module names: text, never markup
            text.append(" changes the training's numerics: the losses will not match a run without it.\n\n"
                        "Apply it to the running job? ", style="")
            text.append("y", style="bold")
            text.append(" apply, ")
            text.append("n", style="bold")
            text.append(" cancel")
            yield Static(text, id="confirm-text")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)
