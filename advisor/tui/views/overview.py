"""Overview: the diagnosis in one sentence, step phases over the last steps, loss, and the setting."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from advisor.records.samples import PHASES
from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.tui.chart import Chart
from advisor.tui.format import fmt_loss, sparkline
from advisor.tui.steps_view import StepsView
from advisor.tui.view_model import ViewModel

PHASE_LABELS = {"data_s": "data", "forward_s": "forward", "backward_s": "backward",
                "optimizer_s": "optimizer", "other_s": "other"}
PHASE_COLORS = {"data_s": "yellow", "forward_s": "cyan", "backward_s": "blue",
                "optimizer_s": "magenta", "other_s": "gray"}


def diagnosis_sentence(model: ViewModel) -> str:
    """``Bottleneck: memory: out of memory in aten.mm``, or why there is none yet."""
    d = model.diagnosis
    if not d:
        return "No diagnosis yet: waiting for a deep-sampled step." if not model.finished else "No diagnosis: nothing was measured."
    return f"Bottleneck: {d.bottleneck}: {d.summary}"


def facts_text(model: ViewModel) -> Text:
    device = model.device.get("name") or model.device.get("type") or "unknown device"
    text = Text()
    text.append("device ", style="dim")
    text.append(str(device))
    text.append("   ranks ", style="dim")
    shown = f"{model.world_size} (showing rank {model.rank}"
    shown += ", the slowest)" if model.world_size > 1 and model.rank == model.slowest_rank else ")"
    text.append(shown)
    text.append("   budget ", style="dim")
    text.append(fmt_bytes(model.budget_bytes) if model.budget_bytes else "none")
    text.append("\nremedies in force ", style="dim")
    text.append(", ".join(r.remedy or str(r.recommendation_id) for r in model.in_force) or "none")
    state = "finished" if model.finished else ("running" if model.live else "recorded")
    text.append("   job ", style="dim")
    text.append(state if not model.finished else f"finished: {model.exit_reason or 'exit code ' + str(model.exit_code)}")
    return text


def loss_text(model: ViewModel) -> Text:
    losses = [s.loss for s in model.steps]
    text = Text("loss ", style="dim")
    if not any(v is not None for v in losses):
        text.append("no loss recorded yet", style="dim")
        return text
    text.append(sparkline(losses, 40), style="green")
    last = next((v for v in reversed(losses) if v is not None), None)
    text.append(f"  last {fmt_loss(last)}")
    return text


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
    OverviewView > #overview-loss { height: 1; padding: 0 1; }
    OverviewView > #phases-chart { height: 1fr; }
    OverviewView > StepsView { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="overview-diagnosis")
        yield Static("", id="overview-facts")
        yield Chart(id="phases-chart")
        yield Static("", id="overview-loss")
        yield StepsView(id="steps")  # the step table (updated from the state by the app, as before)

    def update_model(self, model: ViewModel) -> None:
        self.query_one("#overview-diagnosis", Static).update(diagnosis_sentence(model))
        self.query_one("#overview-facts", Static).update(facts_text(model))
        self.query_one("#overview-loss", Static).update(loss_text(model))
        steps = model.steps
        if not steps:
            self.query_one(Chart).draw(None, Text("no steps yet", style="dim"))
            return
        labels = [str(s.index) for s in steps]
        series = [[s.phases.get(p, 0.0) * 1e3 for s in steps] for p in PHASES]

        def plot(plt: object) -> None:
            plt.stacked_bar(labels, series, labels=[PHASE_LABELS[p] for p in PHASES],  # type: ignore[attr-defined]
                            color=[PHASE_COLORS[p] for p in PHASES])
            plt.title(f"step time by phase, rank {model.rank} (ms)")  # type: ignore[attr-defined]

        self.query_one(Chart).draw(plot, phase_table(model))

    @property
    def plain(self) -> str:
        return "\n".join(str(self.query_one(f"#{name}", Static).content)
                         for name in ("overview-diagnosis", "overview-facts", "overview-loss"))
