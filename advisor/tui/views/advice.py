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
from advisor.tui.recommendations_view import RecommendationsView
from advisor.tui.result_view import ResultView
from advisor.tui.view_model import ViewModel

MIB = 1024 * 1024


def curve_table(curve: list[dict[str, Any]]) -> Table:
    table = Table("budget", "peak", "added time", box=None, pad_edge=False)
    for p in sorted(curve, key=lambda p: p.get("budget_bytes") or 0):
        table.add_row(fmt_bytes(p.get("budget_bytes")), fmt_bytes(p.get("peak_memory_bytes")),
                      "+" + fmt_seconds(p.get("overhead_s")))
    return table


def history_rows(applied: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per apply or revert, oldest first: remedy, status, step, predicted and measured."""
    rows = []
    for r in applied:
        predicted = r.get("predicted") or {}
        measured = r.get("measured") or {}
        after = measured.get("after") or {}
        before = measured.get("before") or {}
        rows.append((str(r.get("remedy") or r.get("recommendation_id")), str(r.get("status")),
                     "" if r.get("at_step") is None else str(r["at_step"]),
                     fmt_seconds(predicted.get("step_time_s")),
                     f"{fmt_seconds(before.get('step_time_s'))} → {fmt_seconds(after.get('step_time_s'))}" if measured else "—",
                     fmt_bytes(predicted.get("peak_memory_bytes")),
                     f"{fmt_bytes(before.get('peak_memory_bytes'))} → {fmt_bytes(after.get('peak_memory_bytes'))}" if measured else "—"))
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

    def show_curve(self, rec: dict[str, Any] | None) -> None:
        chart = self.query_one(Chart)
        curve = (rec or {}).get("curve") or []
        if not curve:
            chart.draw(None, Text("no trade-off curve for the selected remedy", style="dim"))
            return
        points = sorted(curve, key=lambda p: p.get("budget_bytes") or 0)

        def plot(plt: Any) -> None:
            peaks = [(p.get("peak_memory_bytes") or 0) / MIB for p in points]
            added = [(p.get("overhead_s") or 0) * 1e3 for p in points]
            plt.plot(peaks, added, marker="braille", color="cyan")
            plt.scatter(peaks, added, color="yellow")
            plt.xlabel("peak memory (MiB)")
            plt.title(f"{rec.get('title') or rec.get('remedy')}: added step time (ms) by peak")  # type: ignore[union-attr]

        chart.draw(plot, curve_table(points))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "recs-table":
            self.show_curve(self.query_one(RecommendationsView).selected)
