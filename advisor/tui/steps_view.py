"""The live step table: the last steps of rank 0 with phases, loss, peak memory, and sparklines."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from advisor.state import SessionState
from advisor.tui.format import fmt_bytes, fmt_loss, fmt_ms, fmt_seconds, sparkline
from advisor.records.samples import MEMORY_CATEGORIES, PHASES, MemorySample, StepSample

ROWS = 30  # enough to fill a tall terminal; older steps live in the store
SPARK_WIDTH = 48
_PHASE_LABELS: dict[str, str] = {
    "data_s": "data",
    "forward_s": "fwd",
    "backward_s": "bwd",
    "optimizer_s": "opt",
    "other_s": "other",
}


class StepsTable(DataTable[str]):
    """A DataTable whose Enter is labelled for the footer: it opens the selected recommendation."""

    BINDINGS = [Binding("enter", "app.evidence", "Evidence")]  # also on an empty table


class StepsView(Vertical):
    """Shows rank 0's steps (every rank steps in lockstep at a boundary, so one rank is the story)."""

    DEFAULT_CSS = """
    StepsView { height: 1fr; border: round $primary; }
    StepsView > #steps-summary { height: auto; padding: 0 1; }
    StepsView > DataTable { height: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Steps"
        self._shown: tuple[int, int, int] = (-1, -1, -1)  # (samples, last index, memory samples) drawn

    def compose(self) -> ComposeResult:
        yield Static(Text("waiting for the first step…", style="dim"), id="steps-summary")
        yield StepsTable(id="steps-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one("#steps-table", DataTable)
        table.add_column("step", key="step")
        table.add_column("time", key="time")
        # Phases in bare milliseconds (the summary says so): five unit suffixes per row crowd the table.
        for phase in PHASES:
            table.add_column(_PHASE_LABELS.get(phase, phase), key=phase)
        table.add_column("loss", key="loss")
        table.add_column("peak mem", key="peak")

    @property
    def summary_text(self) -> str:
        """The summary lines as plain text (what a test or screen reader sees)."""
        return str(self.query_one("#steps-summary", Static).content)

    def update_state(self, state: SessionState) -> None:
        steps = state.rank0_steps()
        key = (len(steps), steps[-1].index if steps else -1, len(state.memory))
        if key == self._shown:
            return  # the table is the costly part; redraw it only when steps arrived
        self._shown = key
        if state.world_size > 1:
            self.border_title = f"Steps (rank 0 of {state.world_size})"
        summary = _summary(steps)
        memory = memory_line(state.memory[-1] if state.memory else None)
        if memory:
            summary.append("\n")
            summary.append_text(memory)
        self.query_one("#steps-summary", Static).update(summary)
        table = self.query_one("#steps-table", DataTable)
        table.clear()
        # Newest first: the row a person looks at stays at the top while steps stream in.
        for sample in reversed(steps[-ROWS:]):
            table.add_row(*_row(sample), key=str(sample.index))


def _row(sample: StepSample) -> list[str]:
    phases = [fmt_ms(sample.phases.get(p)) for p in PHASES]
    return [
        str(sample.index),
        fmt_seconds(sample.time_s),
        *phases,
        fmt_loss(sample.loss),
        fmt_bytes(sample.peak_memory_bytes),
    ]


def _summary(steps: list[StepSample]) -> Text:
    if not steps:
        return Text("waiting for the first step…", style="dim")
    last = steps[-1]
    times = [s.time_s for s in steps]
    losses = [s.loss for s in steps]
    recent = times[-20:]
    mean = sum(recent) / len(recent)
    text = Text()
    text.append(f"step {last.index}", style="bold")
    text.append(f"   mean of last {len(recent)}: {fmt_seconds(mean)}/step")
    text.append("   phases in ms", style="dim")
    if last.peak_memory_bytes is not None:
        text.append(f"   peak {fmt_bytes(last.peak_memory_bytes)}")
    text.append("\nstep time ")
    text.append(sparkline(times, SPARK_WIDTH), style="cyan")
    text.append(f" {fmt_seconds(last.time_s)}")
    text.append("\nloss      ")
    text.append(sparkline(losses, SPARK_WIDTH), style="green")
    text.append(f" {fmt_loss(last.loss)}")
    return text


def memory_line(sample: MemorySample | None) -> Text | None:
    """The latest memory sample by category, largest first; None before any arrives."""
    if sample is None:
        return None
    parts = sorted(
        ((name, sample.categories.get(name, 0)) for name in MEMORY_CATEGORIES if sample.categories.get(name)),
        key=lambda item: -item[1],
    )
    text = Text()
    text.append("memory    ")
    text.append(fmt_bytes(sample.total_bytes), style="bold")
    if parts:
        text.append("  " + " · ".join(f"{name.replace('_', ' ')} {fmt_bytes(size)}" for name, size in parts))
    if sample.reserved_bytes is not None:
        text.append(f"  (reserved {fmt_bytes(sample.reserved_bytes)})", style="dim")
    return text
