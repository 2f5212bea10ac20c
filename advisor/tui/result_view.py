"""Apply results: what is in flight, then predicted against measured for each remedy applied."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from advisor.state import SessionState
from advisor.tui.format import fmt_bytes, fmt_change, fmt_seconds

SHOWN_RESULTS = 3  # newest first; the store and the report keep all of them
_STATUS_STYLE: dict[str, tuple[str, str]] = {
    "kept": ("✓", "bold green"),
    "reverted": ("↺", "bold yellow"),
    "failed": ("✗", "bold red"),
}


class ResultView(Static):
    """One block of text; the app tells it what is pending and what the source said."""

    DEFAULT_CSS = """
    ResultView { height: auto; min-height: 3; max-height: 14; border: round $accent; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(Text("No remedy applied yet. Select a live recommendation and press a.", style="dim"), id=id)
        self.border_title = "Applied remedies"
        self.pending: dict[str, Any] | None = None  # {"recommendation_id", "title"} the app asked for
        self.notice: Text | None = None  # the last error the source returned, or other news

    @property
    def plain(self) -> str:
        return str(self.content)

    def update_state(self, state: SessionState) -> None:
        self.update(result_text(state, self.pending, self.notice))


def result_text(state: SessionState, pending: dict[str, Any] | None, notice: Text | None) -> Text:
    titles = {str(r.get("id")): str(r.get("title") or r.get("remedy")) for r in state.recommendations}
    text = Text()
    # A request still marked pending when the job has ended will never be applied.
    in_flight = pending or (None if state.finished else state.pending_apply)
    if in_flight:
        rec_id = str(in_flight.get("recommendation_id"))
        text.append(f"⟳ applying {titles.get(rec_id, rec_id)} at next step boundary…", style="bold cyan")
    if notice is not None:
        if text:
            text.append("\n")
        text.append_text(notice)
    for result in reversed(state.applied[-SHOWN_RESULTS:]):
        if text:
            text.append("\n")
        text.append_text(describe_result(result, titles))
    if not text:
        return Text("No remedy applied yet. Select a live recommendation and press a.", style="dim")
    return text


def describe_result(result: dict[str, Any], titles: dict[str, str] | None = None) -> Text:
    """One applied result: status, then predicted against measured memory and time, then any error."""
    status = str(result.get("status", "?"))
    mark, style = _STATUS_STYLE.get(status, ("?", "bold"))
    rec_id = str(result.get("recommendation_id", ""))
    name = (titles or {}).get(rec_id) or str(result.get("remedy") or rec_id)
    text = Text()
    text.append(f"{mark} {status}", style=style)
    text.append(f"  {name}")
    if result.get("at_step") is not None:
        text.append(f" at step {result['at_step']}", style="dim")
    predicted = result.get("predicted") or {}
    measured = result.get("measured") or {}
    before = measured.get("before") or {}
    after = measured.get("after") or {}
    text.append("\n    peak memory  predicted ")
    text.append(fmt_bytes(predicted.get("peak_memory_bytes")))
    text.append("  measured ")
    text.append(_measured(before.get("peak_memory_bytes"), after.get("peak_memory_bytes"), fmt_bytes))
    text.append("\n    step time    predicted ")
    text.append(fmt_seconds(predicted.get("step_time_s")))
    text.append("  measured ")
    text.append(_measured(before.get("step_time_s"), after.get("step_time_s"), fmt_seconds))
    if result.get("error") or status == "failed":
        text.append("\n    error: ", style="bold red")
        text.append(str(result.get("error") or "no error text reported"), style="red")
    if status == "failed":
        # The executor reverts a failed remedy (DESIGN, Acting); say so, or people fear a broken job.
        text.append("\n    rolled back: training goes on as before", style="italic")
    if result.get("reason"):
        text.append(f"\n    why: {result['reason']}", style="italic")
    return text


def _measured(before: float | int | None, after: float | int | None, fmt: Any) -> str:
    if before is None and after is None:
        return "—"
    if after is None:
        return f"{fmt(before)} before, nothing after"
    return f"{fmt(before)} → {fmt(after)} ({fmt_change(before, after)})"
