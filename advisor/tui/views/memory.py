"""Memory: the latest deep step's timeline by category with its peak, the per-module table, OOM, CUDA."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from advisor.records.samples import MEMORY_CATEGORIES
from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.rich_text import name_text
from advisor.tui.chart import Chart
from advisor.tui.view_model import ViewModel

MIB = 1024 * 1024
# (column label, module row key, formatter); the table sorts on any of them (key s).
MODULE_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("activation", "activation_bytes", fmt_bytes), ("input", "input_bytes", fmt_bytes),
    ("output", "output_bytes", fmt_bytes), ("params", "parameter_bytes", fmt_bytes),
    ("fwd", "forward_s", fmt_seconds), ("bwd", "backward_s", fmt_seconds),
)
MODULE_ROWS = 200


def latest_step_timeline(memory: dict[str, Any], deep_steps: set[int]) -> tuple[int | None, list[dict[str, Any]]]:
    """The report timeline's points of the latest deep-sampled step (light steps record a few
    boundary samples only), else of the step with the most points, in time order."""
    timeline = memory.get("timeline") or []
    if not timeline:
        return None, []
    counts: dict[int, int] = {}
    for p in timeline:
        counts[p["step"]] = counts.get(p["step"], 0) + 1
    deep = [s for s in counts if s in deep_steps]
    step = max(deep) if deep else max(counts, key=lambda s: (counts[s], s))
    return step, [p for p in timeline if p["step"] == step]


def summary_text(model: ViewModel) -> Text:
    memory = model.memory
    text = Text()
    peak = memory.get("peak_bytes")
    text.append("peak ", style="dim")
    text.append(fmt_bytes(peak), style="bold")
    if memory.get("peak_step") is not None:
        text.append(f" at step {memory['peak_step']}")
    if model.budget_bytes:
        share = f" ({peak / model.budget_bytes:.0%})" if peak else ""
        text.append(f" of a {fmt_bytes(model.budget_bytes)} budget{share}")
    at_peak = {c: v for c, v in (memory.get("categories_at_peak") or {}).items() if v}
    if at_peak:
        text.append("\nat the peak ", style="dim")
        text.append(" · ".join(f"{c} {fmt_bytes(v)}" for c, v in sorted(at_peak.items(), key=lambda kv: -kv[1])))
    oom = memory.get("oom")
    if oom:
        text.append("\nOUT OF MEMORY ", style="bold red")
        text.append(f"on rank {oom.get('rank')} at step {oom.get('step')} in {oom.get('op') or '?'}"
                    + (f" ({oom.get('module')})" if oom.get("module") else "")
                    + (f": {oom['message']}" if oom.get("message") else ""), style="red")
    cuda = memory.get("cuda")
    if cuda:
        text.append("\nCUDA ", style="dim")
        text.append(f"allocated {fmt_bytes(cuda.get('peak_allocated_bytes'))} · reserved "
                    f"{fmt_bytes(cuda.get('peak_reserved_bytes'))} · outside PyTorch "
                    f"{fmt_bytes(cuda.get('device_used_outside_torch_bytes'))}")
    return text


def timeline_table(points: list[dict[str, Any]]) -> Table:
    """The chart's fallback: categories at the step's peak point and at its end."""
    table = Table("category", "at peak", "at end", box=None, pad_edge=False)
    if not points:
        return table
    peak = max(points, key=lambda p: p["total_bytes"])
    for c in MEMORY_CATEGORIES:
        if peak["categories"].get(c) or points[-1]["categories"].get(c):
            table.add_row(c, fmt_bytes(peak["categories"].get(c)), fmt_bytes(points[-1]["categories"].get(c)))
    table.add_row("total", fmt_bytes(peak["total_bytes"]), fmt_bytes(points[-1]["total_bytes"]))
    return table


class ModulesTable(DataTable[str]):
    BINDINGS = [Binding("s", "app.sort_modules", "Sort")]


class MemoryView(Vertical):
    DEFAULT_CSS = """
    MemoryView > #memory-summary { height: auto; max-height: 6; padding: 0 1; }
    MemoryView > #memory-chart { height: 1fr; }
    MemoryView > #modules-table { height: 1fr; }
    """

    sort_key: str = "activation_bytes"

    def compose(self) -> ComposeResult:
        yield Static("", id="memory-summary")
        yield Chart(id="memory-chart")
        yield ModulesTable(id="modules-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one("#modules-table", DataTable)
        table.add_column("module", key="name")
        for label, key, _ in MODULE_COLUMNS:
            table.add_column(label, key=key)
        self._model: ViewModel | None = None

    @property
    def summary_plain(self) -> str:
        return str(self.query_one("#memory-summary", Static).content)

    def cycle_sort(self) -> str:
        keys = [key for _, key, _ in MODULE_COLUMNS]
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        if self._model is not None:
            self._fill_modules(self._model)
        return self.sort_key

    def update_model(self, model: ViewModel) -> None:
        self._model = model
        self.query_one("#memory-summary", Static).update(summary_text(model))
        step, points = latest_step_timeline(model.memory, set(model.deep_steps))
        chart = self.query_one(Chart)
        if not points:
            chart.draw(None, Text("no memory timeline (no deep-sampled step on this rank yet)", style="dim"))
        else:
            chart.draw(self._plotter(step, points), timeline_table(points))
        self._fill_modules(model)

    @staticmethod
    def _plotter(step: int | None, points: list[dict[str, Any]]) -> Any:
        times = [p["time"] - points[0]["time"] for p in points]
        used = [c for c in MEMORY_CATEGORIES if any(p["categories"].get(c) for p in points)]
        peak_at = max(range(len(points)), key=lambda i: points[i]["total_bytes"])

        def plot(plt: Any) -> None:
            for c in used:
                plt.plot(times, [p["categories"].get(c, 0) / MIB for p in points], label=c)
            plt.plot(times, [p["total_bytes"] / MIB for p in points], label="total", color="white")
            plt.vline(times[peak_at], "red")
            plt.xlabel("seconds into the step")
            plt.title(f"memory by category, step {step} (MiB); peak {fmt_bytes(points[peak_at]['total_bytes'])} "
                      f"at {fmt_seconds(times[peak_at])}")

        return plot

    def _fill_modules(self, model: ViewModel) -> None:
        table = self.query_one("#modules-table", DataTable)
        table.clear()
        rows = sorted(model.memory.get("modules") or [], key=lambda r: -(r.get(self.sort_key) or 0))
        for row in rows[:MODULE_ROWS]:
            table.add_row(name_text(row.get("name") or "(model)"), *(fmt(row.get(key)) for _, key, fmt in MODULE_COLUMNS))
        label = next(label for label, key, _ in MODULE_COLUMNS if key == self.sort_key)
        self.border_title = f"modules by {label}"
