"""Overview: the diagnosis in one sentence, the setting, step phases over the last steps, the steps."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from advisor.records.samples import PHASES
from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.rich_text import name_text
from advisor.tui.chart import Chart
from advisor.state import SessionState
from advisor.tui.flow import Flow, labelled
from advisor.tui.history import in_force_names
from advisor.tui.steps_view import StepsView
from advisor.tui.views.output import output_text
from advisor.tui.view_model import ViewModel

PHASE_LABELS = {"data_s": "data", "forward_s": "forward", "backward_s": "backward",
                "optimizer_s": "optimizer", "other_s": "other"}
PHASE_COLORS = {"data_s": "orange", "forward_s": "cyan", "backward_s": "blue",
                "optimizer_s": "magenta", "other_s": "gray"}


def diagnosis_sentence(model: ViewModel) -> str:
    """``Bottleneck: memory: out of memory in aten.mm``, or why there is none yet."""
    d = model.diagnosis
    if not d:
        return "No diagnosis yet: waiting for a deep-sampled step." if not model.finished else "No diagnosis: nothing was measured."
    return f"Bottleneck: {d.bottleneck}: {d.summary}"


def facts_lines(model: ViewModel) -> list[list[Any]]:
    """Device, ranks, budget; remedies in force and the job; the script's last line; the regimes."""
    device = model.device.get("name") or model.device.get("type") or "unknown device"
    shown = f"{model.world_size} (showing rank {model.rank}"
    shown += ", the slowest)" if model.world_size > 1 and model.rank == model.slowest_rank else ")"
    state = "finished" if model.finished else ("running" if model.live else "recorded")
    if model.finished:
        state = f"finished: {model.exit_reason or 'exit code ' + str(model.exit_code)}"
    lines: list[list[Any]] = [
        [labelled("device", str(device)), labelled("ranks", shown),
         labelled("budget", fmt_bytes(model.budget_bytes) if model.budget_bytes else "none")],
        [labelled("remedies in force", ", ".join(in_force_names(model.in_force)) or "none"), labelled("job", state)],
    ]
    for regime in model.regimes:
        lines.append([Text(str(regime.get("label")), style="bold"),
                      f"steps {regime.get('first_step')}-{regime.get('last_step')}",
                      labelled("peak", fmt_bytes(regime.get("peak_bytes"))),
                      labelled("median step", fmt_seconds(regime.get("step_time_s")))])
    return lines


def phases_line(model: ViewModel) -> list[Any]:
    """Each phase's mean over the recent steps: the chart's figures in one line (a short terminal)."""
    count = max(len(model.steps), 1)
    fields: list[Any] = [Text(f"phases, mean of the last {len(model.steps)} steps:", style="dim")]
    for phase in PHASES:
        fields.append(f"{PHASE_LABELS[phase]} {fmt_seconds(sum(s.phases.get(phase, 0.0) for s in model.steps) / count)}")
    return fields


def phase_table(model: ViewModel) -> Table:
    table = Table("phase", "mean", "share", box=None, pad_edge=False)
    total = sum(s.time_s for s in model.steps) or 1e-12
    for phase in PHASES:
        value = sum(s.phases.get(phase, 0.0) for s in model.steps)
        table.add_row(PHASE_LABELS[phase], fmt_seconds(value / max(len(model.steps), 1)), f"{value / total:.0%}")
    return table


class OverviewView(Vertical):
    DEFAULT_CSS = """
    OverviewView > #overview-diagnosis { height: auto; padding: 0 1; text-style: bold; }
    OverviewView > #overview-facts { height: auto; padding: 0 1; }
    OverviewView > #overview-output { height: auto; max-height: 1; padding: 0 1; }
    OverviewView > #overview-phases { height: auto; padding: 0 1; display: none; }
    OverviewView > #phases-chart { height: 1fr; }
    OverviewView > StepsView { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="overview-diagnosis")
        yield Flow(id="overview-facts")
        yield Flow(id="overview-output")
        yield Chart(id="phases-chart")
        yield Flow(id="overview-phases")
        yield StepsView(id="steps")  # the step table (updated from the state by the app, as before)

    def update_model(self, model: ViewModel) -> None:
        self.query_one("#overview-diagnosis", Static).update(name_text(diagnosis_sentence(model)))
        self.query_one("#overview-facts", Flow).set_lines(facts_lines(model))
        steps = model.steps
        self.query_one("#overview-phases", Flow).set_lines([phases_line(model)] if steps else [])
        if not steps:
            self.query_one(Chart).draw(None, Text("no steps yet", style="dim"))
            return
        labels = [str(s.index) for s in steps]
        series = [[s.phases.get(p, 0.0) * 1e3 for s in steps] for p in PHASES]

        def plot(plt: Any) -> None:
            # plotext's default bar width overlaps neighbouring steps' bars: one step, one bar.
            plt.stacked_bar(labels, series, color=[PHASE_COLORS[p] for p in PHASES], width=0.6)
            plt.title(f"step time by phase, rank {model.rank}, last {len(steps)} steps")
            plt.xlabel("step")
            plt.ylabel("ms")

        legend = [(PHASE_LABELS[p], PHASE_COLORS[p]) for p in PHASES]
        self.query_one(Chart).draw(plot, phase_table(model), legend=legend)

    def update_output(self, state: SessionState) -> None:
        """The script's last line (8 shows all of it), from the state at every redraw."""
        last = state.output_tail[-1] if state.output_tail else None
        self.query_one("#overview-output", Flow).set_lines([[labelled("output", output_text(last))]] if last else [])

    @property
    def plain(self) -> str:
        return "\n".join([str(self.query_one("#overview-diagnosis", Static).content),
                          self.query_one("#overview-facts", Flow).plain,
                          self.query_one("#overview-output", Flow).plain,
                          self.query_one("#overview-phases", Flow).plain])
