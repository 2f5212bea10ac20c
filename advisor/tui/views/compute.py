"""Compute: the roofline of the rank's ops, the top ops by time, MFU and the memory-bound share."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from advisor.records.units import fmt_seconds
from advisor.rich_text import name_text
from advisor.sections.compute import fmt_roof, roof_footnote
from advisor.tui.chart import Chart
from advisor.tui.fit_table import Column, FitTable
from advisor.tui.flow import Flow, labelled
from advisor.tui.view_model import ViewModel

TOP_OPS = 50


def si(value: float | None, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def ridge(model: ViewModel) -> float | None:
    """The intensity (FLOP/byte) where the memory roof meets the compute roof."""
    peak, bandwidth = model.peak_flops, model.memory_bandwidth
    return peak / bandwidth if peak and bandwidth else None


def summary_lines(model: ViewModel) -> list[list[Any]]:
    c = model.compute
    mfu, share = c.get("mfu"), c.get("memory_bound_share")
    return [
        [labelled("MFU", Text(f"{mfu:.1%}" if isinstance(mfu, (int, float)) else "—", style="bold")),
         labelled("memory-bound share", f"{share:.0%}" if isinstance(share, (int, float)) else "—"),
         labelled("achieved", si(c.get("achieved_flops_per_s"), "FLOP/s"))],
        [labelled("roof", f"{si(model.peak_flops, 'FLOP/s')} ({c.get('dominant_dtype') or '?'})"),
         si(model.memory_bandwidth, "B/s"), labelled("ridge", si(ridge(model), "FLOP/B"))],
    ]


OP_COLUMNS = [Column(key="op", label="op", flex=True, min_width=14), Column(key="time", label="time"),
              Column(key="share", label="share", drop=2), Column(key="bound", label="bound", drop=1),
              Column(key="roof", label="roof", drop=1), Column(key="module", label="module", drop=4),
              Column(key="phase", label="phase", drop=3)]


def ops_table(ops: list[dict[str, Any]], limit: int = 10) -> Table:
    table = Table("op", "time", "bound", "roof", box=None, pad_edge=False)
    for op in ops[:limit]:
        table.add_row(name_text(op["name"]), fmt_seconds(op.get("time_s")), str(op.get("bound") or "—"), fmt_roof(op, "—"))
    table.caption = roof_footnote(ops[:limit])
    return table


class ComputeView(Vertical):
    DEFAULT_CSS = """
    ComputeView > #compute-summary { height: auto; padding: 0 1; }
    ComputeView > #roofline-chart { height: 1fr; }
    ComputeView > #ops-table { height: 1fr; }
    ComputeView > .fit-note { height: 1; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Flow(id="compute-summary")
        yield Chart(id="roofline-chart")
        table = FitTable(OP_COLUMNS, title="top ops by time", id="ops-table")
        yield table
        yield table.note

    @property
    def summary_plain(self) -> str:
        return self.query_one("#compute-summary", Flow).plain

    def update_model(self, model: ViewModel) -> None:
        self.query_one("#compute-summary", Flow).set_lines(summary_lines(model))
        ops = [op for op in model.ops if op.get("intensity") and op.get("achieved_flops_per_s")]
        chart = self.query_one(Chart)
        if not ops:
            chart.draw(None, Text("no ops measured (the compute probe samples deep steps)", style="dim"))
        else:
            chart.draw(self._plotter(model, ops), ops_table(model.ops),
                       legend=[("roof", "red"), ("ops", "cyan")] if model.peak_flops and model.memory_bandwidth
                       else [("ops", "cyan")])
        total = sum(op.get("time_s") or 0.0 for op in model.ops) or 1e-12
        self.query_one(FitTable).set_rows([
            [op["name"], fmt_seconds(op.get("time_s")), f"{(op.get('time_s') or 0) / total:.0%}",
             str(op.get("bound") or "—"), fmt_roof(op, "—"), op.get("module") or "(model)", str(op.get("phase") or "")]
            for op in model.ops[:TOP_OPS]])

    @staticmethod
    def _plotter(model: ViewModel, ops: list[dict[str, Any]]) -> Any:
        xs = [math.log10(op["intensity"]) for op in ops]
        ys = [math.log10(op["achieved_flops_per_s"]) for op in ops]
        peak, bandwidth, knee = model.peak_flops, model.memory_bandwidth, ridge(model)

        def plot(plt: Any) -> None:
            low, high = min(xs + ([math.log10(knee)] if knee else [])) - 0.5, max(xs) + 0.5
            if peak and bandwidth:
                roof_x = [low + (high - low) * i / 40 for i in range(41)]
                plt.plot(roof_x, [math.log10(min(peak, bandwidth * 10 ** x)) for x in roof_x], color="red")
                plt.vline(math.log10(knee), "red")
            plt.scatter(xs, ys, color="cyan")
            plt.xlabel("arithmetic intensity, log10 FLOP/byte")
            plt.ylabel("log10 FLOP/s")
            plt.title(f"roofline, rank {model.rank}: each op's achieved FLOP/s; ridge at {si(knee, 'FLOP/B')}")

        return plot
