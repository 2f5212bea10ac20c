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
from advisor.records.remedy import applied_name
from advisor.records.results import ApplyHistory, ApplyResult
from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.tui.chart import Chart
from advisor.tui.fit_table import Column, FitTable
from advisor.tui.history import applied_rows
from advisor.tui.recommendations_view import RecommendationsView
from advisor.tui.result_view import ResultView
from advisor.tui.view_model import ViewModel

MIB = 1024 * 1024


def _added_s(point: CurvePoint) -> float:
    return point.overhead_s if math.isfinite(point.overhead_s) else 0.0  # no finite cost: nothing drawn


def curve_table(curve: Sequence[CurvePoint]) -> Table:
    table = Table("budget", "peak", "added time", box=None, pad_edge=False)
    for column in table.columns:
        column.no_wrap = True
    for p in sorted(curve, key=lambda p: p.budget_bytes):
        table.add_row(fmt_bytes(p.budget_bytes), fmt_bytes(p.peak_memory_bytes), "+" + fmt_seconds(_added_s(p)))
    return table


def history_columns(world_size: int) -> list[Column]:
    ranks = [Column(key="ranks", label="ranks")] if world_size > 1 else []
    return [Column(key="remedy", label="remedy", flex=True, min_width=12), *ranks,
            Column(key="status", label="status"), Column(key="from", label="from step", drop=1),
            Column(key="measured_step", label="measured step", drop=2),
            Column(key="measured_peak", label="measured peak", drop=2),
            Column(key="pred_step", label="pred. step", drop=3), Column(key="pred_peak", label="pred. peak", drop=3)]


def history_rows(applied: Sequence[ApplyHistory], world_size: int = 1, rank: int | None = None) -> list[list[str]]:
    """One row per decision, oldest first: remedy, the ranks it stands for (several ranks), status,
    the first step it changed, measured (``rank``'s) and predicted step time and peak."""
    rows = []
    for row in applied_rows(applied):
        r = row.shown(rank)
        cells = [applied_name(r.remedy, r.recommendation_id)]
        if world_size > 1:
            cells.append(row.who(world_size))
        cells.append(row.status)
        cells.append("" if r.at_step is None else str(r.at_step))
        if isinstance(r, ApplyResult):
            cells += [f"{fmt_seconds(r.before.step_time_s)} → {fmt_seconds(r.after.step_time_s)}",
                      f"{fmt_bytes(r.before.peak_memory_bytes)} → {fmt_bytes(r.after.peak_memory_bytes)}",
                      fmt_seconds(r.predicted.step_time_s), fmt_bytes(r.predicted.peak_memory_bytes)]
        else:  # a revert on request measures nothing
            cells += ["—", "—", "—", "—"]
        rows.append(cells)
    return rows


class AdviceView(Vertical):
    DEFAULT_CSS = """
    AdviceView > RecommendationsView { height: 1fr; }
    AdviceView > #advice-lower { height: 1fr; min-height: 5; }
    AdviceView > #advice-lower > #curve-chart { width: 1fr; }
    AdviceView > #advice-lower > #history { width: 1fr; }
    AdviceView #history-table { height: 1fr; }
    AdviceView #history > .fit-note { height: 1; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield RecommendationsView(id="recommendations")
        with Horizontal(id="advice-lower"):
            yield Chart(id="curve-chart")
            with Vertical(id="history"):
                table = FitTable(history_columns(1), title="applied remedies", id="history-table")
                yield table
                yield table.note
        yield ResultView(id="results")

    def update_model(self, model: ViewModel) -> None:
        table = self.query_one("#history-table", FitTable)
        table.set_columns(history_columns(model.world_size))
        rows = history_rows(model.applied, model.world_size, model.rank)
        table.set_rows(rows)
        self.query_one("#history").display = bool(rows)
        self.show_curve(self.query_one(RecommendationsView).selected)

    def show_curve(self, rec: Recommendation | None) -> None:
        chart = self.query_one(Chart)
        curve = rec.curve if rec is not None and rec.curve else []
        chart.display = bool(curve)
        self.query_one("#advice-lower").display = bool(curve) or self.query_one("#history").display
        if rec is None or not curve:
            chart.draw(None, Text("no trade-off curve for the selected remedy", style="dim"))
            return
        points = sorted(rec.curve, key=lambda p: p.budget_bytes)
        title = rec.title or rec.remedy

        def plot(plt: Any) -> None:
            peaks = [p.peak_memory_bytes / MIB for p in points]
            added = [_added_s(p) * 1e3 for p in points]
            plt.plot(peaks, added, marker="braille", color="cyan")
            plt.scatter(peaks, added, color="orange")
            plt.xlabel("predicted peak memory, MiB")
            plt.ylabel("added ms/step")
            plt.title(f"{title}: trade-off, added step time by peak memory")

        chart.draw(plot, curve_table(points), legend=[("a plan the solver considered", "orange")])

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "recs-table":
            self.show_curve(self.query_one(RecommendationsView).selected)
