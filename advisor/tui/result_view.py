"""Apply results: what is in flight, then predicted against measured for each remedy applied."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from advisor.state import SessionState
from advisor.tui.format import fmt_bytes, fmt_change, fmt_seconds
from advisor.tui.history import applied_rows

SHOWN_RESULTS = 3  # newest first; the store and the report keep all of them
NOTHING_YET = "No remedy applied yet. Select a live recommendation and press a."
NOTHING_RECORDED = "No remedy was applied in this session (p writes the selected one to a plan file)."
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
        super().__init__(Text(NOTHING_YET, style="dim"), id=id)
        self.border_title = "Applied remedies"
        self.pending: dict[str, Any] | None = None  # {"recommendation_id", "title"} the app asked for
        self.notice: Text | None = None  # the last error the source returned, or other news
        self.rank: int | None = None  # the rank the views show: its measurements are the ones described
        self.read_only = False  # a recorded session: nothing can be applied from here

    @property
    def plain(self) -> str:
        return str(self.content)

    def update_state(self, state: SessionState) -> None:
        self.update(result_text(state, self.pending, self.notice, rank=self.rank,
                                empty=NOTHING_RECORDED if self.read_only else NOTHING_YET))


def result_text(state: SessionState, pending: dict[str, Any] | None, notice: Text | None, *,
                rank: int | None = None, empty: str = "") -> Text:
    """What is in flight, then one block per decision, newest first: the ranks that agreed on it,
    predicted against measured (``rank``'s measurement when it reported one)."""
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
    started = {(str(e.data.get("recommendation_id")), e.data.get("at_step")): e.data
               for e in state.events if e.name == "apply_started"}
    for row in reversed(applied_rows(state.applied)[-SHOWN_RESULTS:]):
        if text:
            text.append("\n")
        result = row.shown(rank)
        who = row.who(state.world_size)
        if who and len(row.ranks) > 1 and result.get("rank") is not None:
            who += f" (rank {result['rank']}'s measurement)"
        text.append_text(describe_result(_with_known_before(result, started), titles, who=who))
    if not text:
        return Text(empty or NOTHING_YET, style="dim")
    return text


def _with_known_before(result: dict[str, Any], started: dict[tuple[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """The result with its "before" figures completed from its ``apply_started`` event, which
    carries them as soon as the apply begins."""
    begun = started.get((str(result.get("recommendation_id")), result.get("at_step")))
    if not begun or not begun.get("before"):
        return result
    measured = dict(result.get("measured") or {})
    measured["before"] = {**begun["before"], **{k: v for k, v in (measured.get("before") or {}).items()
                                                  if v is not None}}
    return {**result, "measured": measured}


def _window(figures: dict[str, Any]) -> str:
    steps = figures.get("steps") or []
    if not steps:
        return ""
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {min(steps)}-{max(steps)}"


def describe_result(result: dict[str, Any], titles: dict[str, str] | None = None, *, who: str = "") -> Text:
    """One applied result: status, then predicted against measured memory and time, then any error.
    ``who``: the ranks it stands for ("all 2 ranks", "rank 1"), on a job of several."""
    status = str(result.get("status", "?"))
    mark, style = _STATUS_STYLE.get(status, ("?", "bold"))
    rec_id = str(result.get("recommendation_id", ""))
    name = (titles or {}).get(rec_id) or str(result.get("remedy") or rec_id)
    text = Text()
    text.append(f"{mark} {status}", style=style)
    text.append(f"  {name}")
    if result.get("at_step") is not None:
        # The first step run with the change (it happens at the boundary after the step before).
        text.append(f" from step {result['at_step']}", style="dim")
    if who:
        text.append(f" · {who}", style="bold")
    predicted = result.get("predicted") or {}
    measured = result.get("measured") or {}
    before = measured.get("before") or {}
    after = measured.get("after") or {}
    if status == "reverted" and not measured:
        # A later revert on request: the job from here on is the one before the remedy.
        text.append("\n    reverted on request: the job runs as before the remedy from the next step",
                    style="italic")
        return text
    windows = [w for w in (_window(before), _window(after)) if w]
    if windows:
        text.append(f"\n    measured on {' → '.join(windows)}", style="dim")
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
