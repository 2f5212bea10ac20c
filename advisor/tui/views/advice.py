"""Recommendations: the diagnosis and ranked remedies (with apply class), the selected one's
trade-off curve as a chart, predicted against measured after each apply, and the history."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable

from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.tui.chart import Chart
from advisor.tui.fit_table import Column, FitTable
from advisor.tui.history import applied_rows
from advisor.tui.recommendations_view import RecommendationsView
from advisor.tui.result_view import ResultView
from advisor.tui.view_model import ViewModel

MIB = 1024 * 1024


def curve_table(curve: list[dict[str, Any]]) -> Table:
    table = Table("budget", "peak", "added time", box=None, pad_edge=False)
    for column in table.columns:
        column.no_wrap = True
    for p in sorted(curve, key=lambda p: p.get("budget_bytes") or 0):
        table.add_row(fmt_bytes(p.get("budget_bytes")), fmt_bytes(p.get("peak_memory_bytes")),
                      "+" + fmt_seconds(p.get("overhead_s")))
    return table


def history_columns(world_size: int) -> list[Column]:
    ranks = [Column(key="ranks", label="ranks")] if world_size > 1 else []
    return [Column(key="remedy", label="remedy", flex=True, min_width=12), *ranks,
            Column(key="status", label="status"), Column(key="from", label="from step", drop=1),
            Column(key="measured_step", label="measured step", drop=2),
            Column(key="measured_peak", label="measured peak", drop=2),
            Column(key="pred_step", label="pred. step", drop=3), Column(key="pred_peak", label="pred. peak", drop=3)]


def history_rows(applied: list[dict[str, Any]], world_size: int = 1, rank: int | None = None) -> list[list[str]]:
    """One row per decision, oldest first: remedy, the ranks it stands for (several ranks), status,
    the first step it changed, measured (``rank``'s) and predicted step time and peak."""
    rows = []
    for row in applied_rows(applied):
        r = row.shown(rank)
        predicted = r.get("predicted") or {}
        measured = r.get("measured") or {}
        after = measured.get("after") or {}
        before = measured.get("before") or {}
        cells = [str(r.get("remedy") or r.get("recommendation_id"))]
        if world_size > 1:
            cells.append(row.who(world_size))
        cells += [row.status, "" if r.get("at_step") is None else str(r["at_step"]),
                  f"{fmt_seconds(before.get('step_time_s'))} → {fmt_seconds(after.get('step_time_s'))}" if measured else "—",
                  f"{fmt_bytes(before.get('peak_memory_bytes'))} → {fmt_bytes(after.get('peak_memory_bytes'))}" if measured else "—",
                  fmt_seconds(predicted.get("step_time_s")), fmt_bytes(predicted.get("peak_memory_bytes"))]
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

    def show_curve(self, rec: dict[str, Any] | None) -> None:
        chart = self.query_one(Chart)
        curve = (rec or {}).get("curve") or []
        chart.display = bool(curve)
        self.query_one("#advice-lower").display = bool(curve) or self.query_one("#history").display
        if not curve:
            chart.draw(None, Text("no trade-off curve for the selected remedy", style="dim"))
            return
        points = sorted(curve, key=lambda p: p.get("budget_bytes") or 0)

        def plot(plt: Any) -> None:
            peaks = [(p.get("peak_memory_bytes") or 0) / MIB for p in points]
            added = [(p.get("overhead_s") or 0) * 1e3 for p in points]
            plt.plot(peaks, added, marker="braille", color="cyan")
            plt.scatter(peaks, added, color="orange")
            plt.xlabel("predicted peak memory, MiB")
            plt.ylabel("added ms/step")
            plt.title(f"{rec.get('title') or rec.get('remedy')}: trade-off, added step time by peak memory")  # type: ignore[union-attr]

        chart.draw(plot, curve_table(points), legend=[("a plan the solver considered", "orange")])

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "recs-table":
            self.show_curve(self.query_one(RecommendationsView).selected)
