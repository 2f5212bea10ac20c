"""A chart that becomes a text table when its room is too small to read a plot.

The plot is drawn by plotext through textual-plotext's ``PlotextPlot``; each view hands
``Chart.draw`` a function that plots on a plotext figure and the same figures as a rich
table. Below ``MIN_WIDTH`` x ``MIN_HEIGHT`` cells the plot's axes eat the data, so the
table is shown instead (an 80x24 terminal gives most charts their plot, a split pane may not).

Series are named in a legend line under the plot, never by plotext's own legend, which it
draws inside the plot area over the first bars or points.
"""

from __future__ import annotations

import io
from typing import Any, Callable

from rich.console import Console, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from advisor.tui.flow import Flow

MIN_WIDTH = 36
# A title, an x axis with its ticks, the axis labels' row and the legend take 5 rows: fewer than
# 6 rows of data do not read.
MIN_HEIGHT = 11

Draw = Callable[[Any], None]  # receives textual_plotext's Plot (plotext's figure API)
Legend = list[tuple[str, str]]  # (series name, plotext colour name), in drawing order


# plotext's names for the 16 terminal colours and their numbers (plotext/_dict.py, color_codes):
# the legend draws each series' swatch in the very colour plotext drew it.
PLOTEXT_COLORS = {"black": 0, "red": 1, "green": 2, "orange": 3, "blue": 4, "magenta": 5, "cyan": 6,
                  "gray+": 7, "gray": 8, "red+": 9, "green+": 10, "orange+": 11, "blue+": 12,
                  "magenta+": 13, "cyan+": 14, "white": 15}


def legend_style(color: str) -> str:
    """A plotext colour name as a rich style of the same terminal colour."""
    code = PLOTEXT_COLORS.get(color)
    return f"color({code})" if code is not None else color


def legend_fields(legend: Legend) -> list[Text]:
    fields = []
    for name, color in legend:
        field = Text()
        field.append("■ ", style=legend_style(color))
        field.append(name)
        fields.append(field)
    return fields


class Chart(Vertical):
    """``draw(plot, table)``: the plot when there is room for it, else ``table``."""

    DEFAULT_CSS = """
    Chart { height: 1fr; min-height: 4; }
    Chart > PlotextPlot { height: 1fr; }
    Chart > .chart-legend { height: auto; padding: 0 1; }
    Chart > .chart-table { height: 1fr; overflow-y: auto; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._draw: Draw | None = None
        self._table: RenderableType = Text("no data yet", style="dim")
        self._legend: Legend = []

    def compose(self) -> ComposeResult:
        yield PlotextPlot()
        yield Flow(classes="chart-legend")
        yield Static(self._table, classes="chart-table")

    def on_mount(self) -> None:
        self._show()

    def draw(self, plot: Draw | None, table: RenderableType, *, legend: Legend | None = None) -> None:
        """Replace what the chart shows; ``plot`` None means no data (the table says why).
        ``legend``: the series' names and colours, shown under the plot."""
        self._draw, self._table, self._legend = plot, table, list(legend or [])
        if self.is_mounted:
            self._show()

    @property
    def plotted(self) -> bool:
        """Whether the plot (not the table) is on screen."""
        return bool(self.query_one(PlotextPlot).display)

    @property
    def legend_plain(self) -> str:
        """The legend's series names (empty when the plot is not shown)."""
        legend = self.query_one(".chart-legend", Flow)
        return legend.plain if legend.display else ""

    @property
    def table_plain(self) -> str:
        """The fallback table as plain text (what a test or a screen reader sees)."""
        if isinstance(self._table, Text):
            return self._table.plain
        console = Console(width=max(self.size.width, 40), record=True, file=io.StringIO())
        console.print(self._table)
        return console.export_text()

    def on_resize(self) -> None:
        self._show()

    def _show(self) -> None:
        plot_widget = self.query_one(PlotextPlot)
        table = self.query_one(".chart-table", Static)
        roomy = self.size.width >= MIN_WIDTH and self.size.height >= MIN_HEIGHT
        show_plot = self._draw is not None and (roomy or self.size.width == 0)
        legend = self.query_one(".chart-legend", Flow)
        plot_widget.display, table.display = show_plot, not show_plot
        legend.display = show_plot and bool(self._legend)
        legend.set_lines([legend_fields(self._legend)])
        table.update(self._table)
        if self._draw is not None:
            plt = plot_widget.plt
            plt.clear_figure()
            self._draw(plt)
            plot_widget.refresh()
