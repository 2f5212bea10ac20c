"""The diagnosis and the ranked recommendations with predicted memory and time against baseline."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from advisor.records.advice import Diagnosis, Evidence, Recommendation
from advisor.records.remedy import applied_name
from advisor.records.results import ApplyResult, ApplyStarted
from advisor.records.units import fmt_quantity
from advisor.state import SessionState
from advisor.tui.fit_table import Column, FitTable
from advisor.tui.format import MISSING, fmt_bytes, fmt_change, fmt_seconds



def diagnosis_text(diagnosis: Diagnosis | None, recommendations: list[Recommendation] | None = None,
                   measured_peak: int | None = None) -> Text:
    """The bottleneck, its one-line summary, the evidence under it, and the baseline remedies start
    from. A remedy that predicts no memory change leaves the baseline's peak unsaid: then the peak
    measured on the job as it is now (``measured_peak``) is the baseline's."""
    if not diagnosis:
        return Text("no diagnosis yet: it comes after the first measured steps", style="dim")
    text = Text()
    text.append("Bottleneck: ", style="bold")
    text.append(diagnosis.bottleneck, style="bold yellow")
    if diagnosis.summary:
        text.append(f"  {diagnosis.summary}")
    baselines = [r.baseline for r in recommendations or []]
    peak = next((b.peak_memory_bytes for b in baselines if b.peak_memory_bytes is not None), measured_peak)
    step = next((b.step_time_s for b in baselines if b.step_time_s is not None), None)
    if baselines and (peak is not None or step is not None):
        # The table shows predictions only, to fit; this line is what they are compared with
        # (second, so a short terminal's two lines of diagnosis still show it).
        text.append("\nBaseline: ", style="bold")
        text.append(f"peak {fmt_bytes(peak)}, {fmt_seconds(step)}/step")
    for item in diagnosis.evidence:
        text.append("\n  • ")
        text.append(_evidence_line(item))
    return text


def _evidence_line(item: Evidence) -> str:
    line = f"{item.what}: {fmt_quantity(item.value, item.unit)}"
    if item.threshold is not None:
        line += f" (threshold {fmt_quantity(item.threshold, item.unit)})"
    return line


def status_by_recommendation(state: SessionState) -> dict[str, str]:
    """The latest outcome per recommendation id, and "applying…" for the one in flight."""
    out: dict[str, str] = {}
    for result in state.applied:
        out[str(result.recommendation_id)] = str(result.status)
    if state.pending_apply and not state.finished:
        out[state.pending_apply.recommendation_id] = "applying…"
    return out


def measuring(state: SessionState) -> ApplyStarted | None:
    """The start of an apply whose result has not arrived yet, or None."""
    if state.finished:
        return None
    started = None
    for event in state.events:
        if event.name == ApplyStarted.NAME:
            started = ApplyStarted.of(event)
        elif event.name == ApplyResult.NAME:
            started = None
    return started


class RecommendationsTable(FitTable):
    """A table whose Enter is labelled for the footer: it opens the evidence screen."""

    BINDINGS = [Binding("enter", "select_cursor", "Evidence")]


def rec_columns(recommendations: list[Recommendation], *, status: bool = True) -> list[Column]:
    """The id and title shorten before any figure goes; the step time is the last figure to go.
    ``status``: some recommendation was applied (else the column would be empty)."""
    longest_id = max((len(r.id) for r in recommendations), default=8)
    return [Column(key="rank", label="#"),
            Column(key="title", label="recommendation", flex=True, min_width=min(longest_id, 24) + 6),
            Column(key="time", label="step time"), Column(key="memory", label="peak memory", drop=1),
            Column(key="flags", label="class", drop=3), Column(key="confidence", label="conf", drop=4),
            *([Column(key="status", label="status", drop=2)] if status else [])]


class RecommendationsView(Vertical):
    """Diagnosis on top, then one row per recommendation in rank order; Enter opens its evidence."""

    DEFAULT_CSS = """
    RecommendationsView { height: 1fr; border: round $secondary; }
    RecommendationsView > #diagnosis { height: auto; max-height: 8; padding: 0 1; overflow-y: auto; }
    RecommendationsView > #recs-table { height: 1fr; min-height: 4; }
    RecommendationsView > .fit-note { height: 1; padding: 0 1; }
    """

    class Opened(Message):
        """The user chose a recommendation to read its evidence."""

        def __init__(self, recommendation: Recommendation) -> None:
            super().__init__()
            self.recommendation = recommendation

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Diagnosis and recommendations"
        self._recommendations: list[Recommendation] = []
        self._signature: object = None
        self._shown: tuple[Diagnosis | None, list[Recommendation]] | None = None
        self.measured_peak: int | None = None  # the peak of the job as it is now (the app sets it)

    def compose(self) -> ComposeResult:
        yield Static(diagnosis_text(None), id="diagnosis")
        table = RecommendationsTable(rec_columns([]), title="recommendations", id="recs-table")
        yield table
        yield table.note

    @property
    def diagnosis_plain(self) -> str:
        return str(self.query_one("#diagnosis", Static).content)

    @property
    def recommendations(self) -> list[Recommendation]:
        return list(self._recommendations)

    @property
    def selected(self) -> Recommendation | None:
        """The recommendation under the table's cursor, or None when there is none."""
        table = self.query_one("#recs-table", DataTable)
        if not self._recommendations or table.row_count == 0:
            return None
        row = min(max(table.cursor_row, 0), len(self._recommendations) - 1)
        return self._recommendations[row]

    def update_state(self, state: SessionState) -> None:
        statuses = status_by_recommendation(state)
        held = measuring(state)
        diagnosis, recommendations = state.diagnosis, state.recommendations
        if held is not None and self._shown is not None:
            # While a remedy is being measured the steps are neither the old job nor the new one:
            # keep the advice that led to it instead of flipping with every half-measured step.
            diagnosis, recommendations = self._shown
        else:
            self._shown = (diagnosis, list(recommendations))
        signature = (
            repr(diagnosis),
            tuple(r.id for r in recommendations),
            tuple(sorted(statuses.items())),
            held is not None,
            self.measured_peak,
        )
        if signature == self._signature:
            return
        self._signature = signature
        text = diagnosis_text(diagnosis, recommendations, self.measured_peak)
        if held is not None:
            # at_step is the first step run with the remedy: it is applied after the step before it.
            at = held.at_step if held.at_step is not None else "?"
            text.append(f"\nMeasuring {applied_name(held.remedy, held.recommendation_id)}, in force from step {at}: "
                        "advice is held until its result is in.", style="italic cyan")
        self.query_one("#diagnosis", Static).update(text)
        table = self.query_one(RecommendationsTable)
        before = self.selected
        self._recommendations = list(recommendations)
        table.set_columns(rec_columns(self._recommendations, status=bool(statuses)))
        table.set_rows([_row(rank, rec, statuses.get(rec.id), with_status=bool(statuses))
                        for rank, rec in enumerate(self._recommendations, start=1)],
                       keys=[rec.id for rec in self._recommendations])
        # Keep the cursor on the same recommendation when the ranking or statuses change.
        if before is not None:
            for row, rec in enumerate(self._recommendations):
                if rec.id == before.id:
                    table.move_cursor(row=row)
                    break

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        row = event.cursor_row
        if 0 <= row < len(self._recommendations):
            self.post_message(self.Opened(self._recommendations[row]))


def _row(rank: int, rec: Recommendation, status: str | None, *, with_status: bool = True) -> list[str | Text]:
    predicted, baseline = rec.predicted, rec.baseline
    memory = _predicted(fmt_bytes, baseline.peak_memory_bytes, predicted.peak_memory_bytes)
    time = _predicted(fmt_seconds, baseline.step_time_s, predicted.step_time_s)
    flags = str(rec.apply_class)  # live-exact, live-equivalent, live-opt-in or restart
    style = {"kept": "green", "failed": "bold red", "reverted": "yellow", "applying…": "cyan"}.get(status or "", "")
    name = Text(rec.id, style="bold" if rec.applicable else "dim")
    name.append(f"  {rec.title or rec.remedy}", style="" if rec.applicable else "dim")
    if not rec.applicable:
        name.append(f" · not applicable: {rec.why}", style="dim")
        status = status or "n/a"
    return [
        str(rank),
        name,
        _colour_change(time, baseline.step_time_s, predicted.step_time_s),
        _colour_change(memory, baseline.peak_memory_bytes, predicted.peak_memory_bytes),
        Text(flags, style="" if rec.live and rec.applicable else "dim"),
        rec.confidence,
        *([Text(status or "", style=style)] if with_status else []),
    ]


def _predicted(fmt: Any, before: float | None, after: float | None) -> str:
    """``2.00 GiB (-33%)``: the predicted figure and its change against the baseline; a dash
    when the remedy predicts nothing for it."""
    if after is None:
        return MISSING
    return f"{fmt(after)} ({fmt_change(before, after)})"


def _colour_change(text: str, before: float | None, after: float | None) -> Text:
    """Green when the prediction lowers the figure, red when it raises it (both are costs)."""
    change = fmt_change(before, after)
    style = "green" if change.startswith("-") else "red" if change.startswith("+") else ""
    return Text(text, style=style)
