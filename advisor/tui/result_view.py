"""Apply results: what is in flight, then predicted against measured for each remedy applied."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from rich.text import Text
from textual.widgets import Static

from advisor.records.events import payloads
from advisor.records.results import ApplyHistory, ApplyResult, ApplyStarted, Measurement, RevertResult
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
    "interrupted": ("…", "bold magenta"),  # the job ended inside its window: in force, undecided
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
    titles = {r.id: r.title or r.remedy for r in state.recommendations}
    text = Text()
    # A request still marked pending when the job has ended will never be applied.
    if pending:
        in_flight: str | None = str(pending.get("recommendation_id"))
    else:
        in_flight = None if state.finished or state.pending_apply is None else state.pending_apply.recommendation_id
    if in_flight:
        text.append(f"⟳ applying {titles.get(in_flight, in_flight)} at next step boundary…", style="bold cyan")
    if notice is not None:
        if text:
            text.append("\n")
        text.append_text(notice)
    started = {(s.recommendation_id, s.at_step): s for _, s in payloads(state.events, ApplyStarted)}
    for row in reversed(applied_rows(state.applied)[-SHOWN_RESULTS:]):
        if text:
            text.append("\n")
        result = row.shown(rank)
        who = row.who(state.world_size)
        if who and len(row.ranks) > 1 and isinstance(result, ApplyResult):
            who += f" (rank {result.rank}'s measurement)"
        text.append_text(describe_result(_with_known_before(result, started), titles, who=who))
    if not text:
        return Text(empty or NOTHING_YET, style="dim")
    return text


def _with_known_before(result: ApplyHistory, started: dict[tuple[str | None, int | None], ApplyStarted]) -> ApplyHistory:
    """The result with its "before" figures completed from its ``apply_started`` event, which
    carries them as soon as the apply begins."""
    begun = started.get((result.recommendation_id, result.at_step))
    if not isinstance(result, ApplyResult) or begun is None or begun.before is None:
        return result
    known = {f.name: getattr(result.before, f.name) for f in fields(Measurement)
             if getattr(result.before, f.name) not in (None, ())}  # what the result says it measured
    return replace(result, before=replace(begun.before, **known))


def _window(figures: Measurement) -> str:
    steps = figures.steps
    if not steps:
        return ""
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {min(steps)}-{max(steps)}"


def describe_result(result: ApplyHistory, titles: dict[str, str] | None = None, *, who: str = "") -> Text:
    """One applied result: status, then predicted against measured memory and time, then any error.
    ``who``: the ranks it stands for ("all 2 ranks", "rank 1"), on a job of several."""
    status = str(result.status)
    mark, style = _STATUS_STYLE.get(status, ("?", "bold"))
    rec_id = str(result.recommendation_id or "")
    name = (titles or {}).get(rec_id) or result.remedy or rec_id
    text = Text()
    text.append(f"{mark} {status}", style=style)
    text.append(f"  {name}")
    if result.at_step is not None:
        # The first step run with the change (it happens at the boundary after the step before).
        text.append(f" from step {result.at_step}", style="dim")
    if who:
        text.append(f" · {who}", style="bold")
    if isinstance(result, RevertResult):
        # A later revert on request: the job from here on is the one before the remedy.
        text.append("\n    reverted on request: the job runs as before the remedy from the next step",
                    style="italic")
        return text
    predicted, before, after = result.predicted, result.before, result.after
    windows = [w for w in (_window(before), _window(after)) if w]
    if windows:
        text.append(f"\n    measured on {' → '.join(windows)}", style="dim")
    text.append("\n    peak memory  predicted ")
    text.append(fmt_bytes(predicted.peak_memory_bytes))
    text.append("  measured ")
    text.append(_measured(before.peak_memory_bytes, after.peak_memory_bytes, fmt_bytes))
    text.append("\n    step time    predicted ")
    text.append(fmt_seconds(predicted.step_time_s))
    text.append("  measured ")
    text.append(_measured(before.step_time_s, after.step_time_s, fmt_seconds))
    if result.error or status == "failed":
        text.append("\n    error: ", style="bold red")
        text.append(result.error or "no error text reported", style="red")
    if status == "failed":
        # The executor reverts a failed remedy (DESIGN, Acting); say so, or people fear a broken job.
        text.append("\n    rolled back: training goes on as before", style="italic")
    if result.reason:
        text.append(f"\n    why: {result.reason}", style="italic")
    return text


def _measured(before: float | int | None, after: float | int | None, fmt: Any) -> str:
    if before is None and after is None:
        return "—"
    if after is None:
        return f"{fmt(before)} before, nothing after"
    return f"{fmt(before)} → {fmt(after)} ({fmt_change(before, after)})"
