"""Recommendations: the diagnosis and ranked remedies (with apply class), the selected one's
trade-off curve as a chart, predicted against measured after each apply, and the history."""

from __future__ import annotations

import math
from typing import Any, Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable

from advisor.records.advice import CurvePoint, Recommendation
from advisor.records.results import ApplyHistory, ApplyResult
from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.tui.chart import Chart
from advisor.tui.recommendations_view import RecommendationsView
from advisor.tui.result_view import ResultView
from advisor.tui.view_model import ViewModel

MIB = 1024 * 1024


def _added_s(point: CurvePoint) -> float:
    return point.overhead_s if math.isfinite(point.overhead_s) else 0.0  # no finite cost: nothing drawn


def curve_table(curve: Sequence[CurvePoint]) -> Table:
    table = Table("budget", "peak", "added time", box=None, pad_edge=False)
    for p in sorted(curve, key=lambda p: p.budget_bytes):
        table.add_row(fmt_bytes(p.budget_bytes), fmt_bytes(p.peak_memory_bytes), "+" + fmt_seconds(_added_s(p)))
    return table


def history_rows(applied: list[ApplyHistory]) -> list[tuple[str, ...]]:
    """One row per apply or revert, oldest first: remedy, status, step, predicted and measured."""
    rows = []
    for r in applied:
        step = "" if r.at_step is None else str(r.at_step)
        if not isinstance(r, ApplyResult):  # a user's revert: nothing predicted or measured
            rows.append((r.remedy or str(r.recommendation_id), r.status, step, fmt_seconds(None), "—",
                         fmt_bytes(None), "—"))
            continue
        before, after = r.before, r.after
        rows.append((r.remedy or str(r.recommendation_id), r.status, step, fmt_seconds(r.predicted.step_time_s),
                     f"{fmt_seconds(before.step_time_s)} → {fmt_seconds(after.step_time_s)}",
                     fmt_bytes(r.predicted.peak_memory_bytes),
                     f"{fmt_bytes(before.peak_memory_bytes)} → {fmt_bytes(after.peak_memory_bytes)}"))
    return rows


class AdviceView(Vertical):
    DEFAULT_CSS = """
    AdviceView > RecommendationsView { height: 1fr; }
    AdviceView > Horizontal { height: 1fr; }
    AdviceView > Horizontal > #curve-chart { width: 1fr; }
    AdviceView > Horizontal > #history-table { width: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield RecommendationsView(id="recommendations")
        with Horizontal():
            yield Chart(id="curve-chart")
            yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
        yield ResultView(id="results")

    def on_mount(self) -> None:
        table = self.query_one("#history-table", DataTable)
        for label in ("remedy", "status", "at step", "pred. step", "measured step", "pred. peak", "measured peak"):
            table.add_column(label, key=label)

    def update_model(self, model: ViewModel) -> None:
        table = self.query_one("#history-table", DataTable)
        table.clear()
        for row in history_rows(model.applied):
            table.add_row(*row)
        self.show_curve(self.query_one(RecommendationsView).selected)

    def show_curve(self, rec: Recommendation | None) -> None:
        chart = self.query_one(Chart)
        if rec is None or not rec.curve:
            chart.draw(None, Text("no trade-off curve for the selected remedy", style="dim"))
            return
        points = sorted(rec.curve, key=lambda p: p.budget_bytes)
        title = rec.title or rec.remedy

        def plot(plt: Any) -> None:
            peaks = [p.peak_memory_bytes / MIB for p in points]
            added = [_added_s(p) * 1e3 for p in points]
            plt.plot(peaks, added, marker="braille", color="cyan")
            plt.scatter(peaks, added, color="yellow")
            plt.xlabel("peak memory (MiB)")
            plt.title(f"{title}: added step time (ms) by peak")

        chart.draw(plot, curve_table(points))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "recs-table":
            self.show_curve(self.query_one(RecommendationsView).selected)
