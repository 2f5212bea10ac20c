"""Memory: the peak against the budget (now, after any remedy), the step the memory probe traced
as a timeline by category, the per-module table, the OOM record and CUDA's own figures."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical

from advisor.records.samples import MEMORY_CATEGORIES
from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.tui.chart import Chart, Legend
from advisor.tui.fit_table import Column, FitTable
from advisor.tui.flow import Flow, labelled
from advisor.tui.traced_step import TracedStep
from advisor.tui.view_model import ViewModel

MIB = 1024 * 1024
# (column label, module row key, formatter, how soon it drops at a narrow width); the table
# sorts on any of them (key s), and the column it is sorted by never drops.
MODULE_COLUMNS: tuple[tuple[str, str, Any, int], ...] = (
    ("activation", "activation_bytes", fmt_bytes, 1), ("input", "input_bytes", fmt_bytes, 4),
    ("output", "output_bytes", fmt_bytes, 4), ("params", "parameter_bytes", fmt_bytes, 3),
    ("fwd", "forward_s", fmt_seconds, 2), ("bwd", "backward_s", fmt_seconds, 2),
)
MODULE_ROWS = 200
# One colour per category, the same in the plot and its legend (plotext's colour names).
CATEGORY_COLORS = {"parameter": "blue", "gradient": "magenta", "optimizer_state": "orange",
                   "activation": "green", "temporary": "red", "input": "cyan", "other": "gray"}
TOTAL_COLOR = "white"
PEAK_COLOR = "orange+"  # the peak's marker: a colour no category has


def share(peak: int | None, budget: int | None) -> str:
    return f" ({peak / budget:.0%})" if peak and budget else ""


def summary_lines(model: ViewModel) -> list[list[Any]]:
    """The peak against the budget, and what made it; after a remedy, the job's peak now first."""
    whole, now, budget = model.memory, model.memory_now, model.budget_bytes
    lines: list[list[Any]] = []
    of_budget = f" of a {fmt_bytes(budget)} budget" if budget else ""
    if now is not None and now.get("peak_bytes") is not None:
        first = Text()
        first.append("peak now ", style="dim")
        first.append(fmt_bytes(now["peak_bytes"]), style="bold")
        first.append(f" at step {now.get('peak_step')}{of_budget}{share(now['peak_bytes'], budget)}")
        lines.append([first, labelled("since step", str(model.regime_since)),
                      labelled("whole run", f"{fmt_bytes(whole.get('peak_bytes'))} at step {whole.get('peak_step')}"
                                            f"{share(whole.get('peak_bytes'), budget)}")])
        at_peak = now.get("categories_at_peak") or {}
    else:
        peak = whole.get("peak_bytes")
        first = Text()
        first.append("peak ", style="dim")
        first.append(fmt_bytes(peak), style="bold")
        if whole.get("peak_step") is not None:
            first.append(f" at step {whole['peak_step']}")
        first.append(f"{of_budget}{share(peak, budget)}")
        lines.append([first])
        at_peak = whole.get("categories_at_peak") or {}
    oom = whole.get("oom")
    if oom:
        text = Text("OUT OF MEMORY ", style="bold red")
        text.append(f"on rank {oom.get('rank')} at step {oom.get('step')} in {oom.get('op') or '?'}"
                    + (f" ({oom.get('module')})" if oom.get("module") else "")
                    + (f": {oom['message']}" if oom.get("message") else ""), style="red")
        lines.append([text])
    cuda = whole.get("cuda")
    if cuda:
        lines.append([Text("CUDA", style="dim"), labelled("allocated", fmt_bytes(cuda.get("peak_allocated_bytes"))),
                      labelled("reserved", fmt_bytes(cuda.get("peak_reserved_bytes"))),
                      labelled("outside PyTorch", fmt_bytes(cuda.get("device_used_outside_torch_bytes")))])
    # Last: on a short terminal the chart's table (the traced step at its peak) says it again.
    parts = sorted(((c, v) for c, v in at_peak.items() if v), key=lambda kv: -kv[1])
    if parts:
        lines.append([Text("at the peak", style="dim"), *(f"{c} {fmt_bytes(v)}" for c, v in parts)])
    return lines


def trace_table(traced: TracedStep) -> Table:
    """The chart's fallback: the traced step's categories at its own peak and at its end."""
    table = Table("category", f"step {traced.step} at its peak", "at its end", box=None, pad_edge=False)
    for column in table.columns[1:]:
        column.justify, column.no_wrap = "right", True
    peak, end = traced.peak, traced.points[-1]
    for c in MEMORY_CATEGORIES:
        if peak.categories.get(c) or end.categories.get(c):
            table.add_row(c, fmt_bytes(peak.categories.get(c)), fmt_bytes(end.categories.get(c)))
    table.add_row("total", fmt_bytes(peak.total_bytes), fmt_bytes(end.total_bytes))
    return table


def trace_plot(traced: TracedStep) -> tuple[Any, Legend]:
    """The traced step's bytes by category (MiB) over ms from its start, its peak marked."""
    points = traced.points
    times = [p.time_ms for p in points]
    used = [c for c in MEMORY_CATEGORIES if any(p.categories.get(c) for p in points)]
    peak = traced.peak
    legend = [(c, CATEGORY_COLORS.get(c, "gray")) for c in used] + [("total", TOTAL_COLOR), ("peak", PEAK_COLOR)]

    def plot(plt: Any) -> None:
        for c in used:
            plt.plot(times, [p.categories.get(c, 0) / MIB for p in points], color=CATEGORY_COLORS.get(c, "gray"),
                     marker="braille")
        plt.plot(times, [p.total_bytes / MIB for p in points], color=TOTAL_COLOR, marker="braille")
        plt.vline(peak.time_ms, PEAK_COLOR)
        plt.xlabel(f"ms from the start of step {traced.step}")
        plt.ylabel("MiB")
        plt.title(f"memory by category, step {traced.step} (traced by the memory probe, rank {traced.rank}): "
                  f"peak {fmt_bytes(peak.total_bytes)} at {peak.time_ms:.1f} ms")

    return plot, legend


class ModulesTable(FitTable):
    BINDINGS = [Binding("s", "app.sort_modules", "Sort")]


class MemoryView(Vertical):
    DEFAULT_CSS = """
    MemoryView > #memory-summary { height: auto; max-height: 6; padding: 0 1; }
    MemoryView > #memory-chart { height: 1fr; }
    MemoryView > #modules-table { height: 1fr; }
    MemoryView > .fit-note { height: 1; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sort_key = "activation_bytes"
        self._model: ViewModel | None = None

    def compose(self) -> ComposeResult:
        yield Flow(id="memory-summary")
        yield Chart(id="memory-chart")
        table = ModulesTable(self._columns(), title="modules", id="modules-table")
        yield table
        yield table.note

    def _columns(self) -> list[Column]:
        """The module name, then the figures; the sorted one is marked and never drops."""
        return [Column(key="name", label="module", flex=True, min_width=14),
                *(Column(key=key, label=f"{label} ▼" if key == self.sort_key else label,
                         drop=0 if key == self.sort_key else drop)
                  for label, key, _, drop in MODULE_COLUMNS)]

    @property
    def summary_plain(self) -> str:
        return self.query_one("#memory-summary", Flow).plain

    def cycle_sort(self) -> str:
        keys = [key for _, key, _, _ in MODULE_COLUMNS]
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.query_one(ModulesTable).set_columns(self._columns())
        if self._model is not None:
            self._fill_modules(self._model)
        return self.sort_key

    def update_model(self, model: ViewModel) -> None:
        self._model = model
        self.query_one("#memory-summary", Flow).set_lines(summary_lines(model))
        chart = self.query_one(Chart)
        traced = model.traced
        if traced is None or not traced.points:
            chart.draw(None, Text(f"no memory timeline: the memory probe has not traced a step on rank "
                                  f"{model.rank} yet", style="dim"))
        else:
            plot, legend = trace_plot(traced)
            chart.draw(plot, trace_table(traced), legend=legend)
        self._fill_modules(model)

    def _fill_modules(self, model: ViewModel) -> None:
        table = self.query_one(ModulesTable)
        section = model.memory_now if model.memory_now and model.memory_now.get("modules") else model.memory
        rows = sorted(section.get("modules") or [], key=lambda r: -(r.get(self.sort_key) or 0))[:MODULE_ROWS]
        table.set_rows([[row.get("name") or "(model)", *(fmt(row.get(key)) for _, key, fmt, _ in MODULE_COLUMNS)]
                        for row in rows])
