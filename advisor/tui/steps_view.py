"""The live step table: the last steps of the rank shown, with phases, loss, peak memory, sparklines."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Static

from advisor.state import SessionState
from advisor.tui.fit_table import Column, FitTable
from advisor.tui.flow import Flow
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


# Phases in bare milliseconds (the summary says so): five unit suffixes per row crowd the table.
STEP_COLUMNS = [Column(key="step", label="step"), Column(key="time", label="time"),
                *(Column(key=p, label=_PHASE_LABELS.get(p, p), drop=3 if p in ("data_s", "other_s") else 2)
                  for p in PHASES),
                Column(key="loss", label="loss", drop=1), Column(key="peak", label="peak mem", drop=1)]


class StepsTable(FitTable):
    """A table whose Enter is labelled for the footer: it opens the selected recommendation."""

    BINDINGS = [Binding("enter", "app.evidence", "Evidence")]  # also on an empty table


def shown_steps(state: SessionState, rank: int | None) -> tuple[int, list[StepSample]]:
    """The rank the views show (None: the lowest that has steps) and its steps."""
    if rank is None or rank not in state.steps:
        rank = min(state.steps) if state.steps else (0 if rank is None else rank)
    return rank, state.steps.get(rank, [])


class StepsView(Vertical):
    """Shows the steps of the rank every view shows (``[`` and ``]`` switch it)."""

    DEFAULT_CSS = """
    StepsView { height: 1fr; border: round $primary; }
    StepsView > #steps-summary { height: auto; padding: 0 1; }
    StepsView > #steps-sparks { height: auto; padding: 0 1; }
    StepsView > #steps-table { height: 1fr; }
    StepsView > .fit-note { height: 1; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Steps"
        self._shown: tuple[int, ...] = (-1, -1, -1, -1)  # (rank, samples, last index, memory samples) drawn

    def compose(self) -> ComposeResult:
        yield Flow(id="steps-summary")
        yield Static("", id="steps-sparks")
        table = StepsTable(STEP_COLUMNS, title="steps", id="steps-table")
        yield table
        yield table.note

    def on_mount(self) -> None:
        self.query_one("#steps-summary", Flow).set_lines([[Text("waiting for the first step…", style="dim")]])

    @property
    def summary_text(self) -> str:
        """The summary lines as plain text (what a test or screen reader sees)."""
        sparks = str(self.query_one("#steps-sparks", Static).content)
        return self.query_one("#steps-summary", Flow).plain + ("\n" + sparks if sparks else "")

    def update_state(self, state: SessionState, rank: int | None = None) -> None:
        rank, steps = shown_steps(state, rank)
        key = (rank, len(steps), steps[-1].index if steps else -1, len(state.memory))
        if key == self._shown:
            return  # the table is the costly part; redraw it only when steps arrived
        self._shown = key
        if state.world_size > 1:
            self.border_title = f"Steps (rank {rank} of {state.world_size})"
        lines = _summary(steps)
        line = memory_line(next((m for m in reversed(state.memory) if m.rank == rank), None))
        if line:
            lines.append(line)
        self.query_one("#steps-summary", Flow).set_lines(lines)
        self.query_one("#steps-sparks", Static).update(_sparks(steps))
        # Newest first: the row a person looks at stays at the top while steps stream in.
        recent = list(reversed(steps[-ROWS:]))
        self.query_one(StepsTable).set_rows([_row(s) for s in recent], keys=[str(s.index) for s in recent])


def _row(sample: StepSample) -> list[str]:
    phases = [fmt_ms(sample.phases.get(p)) for p in PHASES]
    return [
        str(sample.index),
        fmt_seconds(sample.time_s),
        *phases,
        fmt_loss(sample.loss),
        fmt_bytes(sample.peak_memory_bytes),
    ]


def _summary(steps: list[StepSample]) -> list[list[Text | str]]:
    if not steps:
        return [[Text("waiting for the first step…", style="dim")]]
    last = steps[-1]
    recent = [s.time_s for s in steps[-20:]]
    fields: list[Text | str] = [Text(f"step {last.index}", style="bold"),
                                f"mean of last {len(recent)}: {fmt_seconds(sum(recent) / len(recent))}/step",
                                Text("phases in ms", style="dim")]
    if last.peak_memory_bytes is not None:
        fields.append(f"peak {fmt_bytes(last.peak_memory_bytes)}")
    return [fields]


def _sparks(steps: list[StepSample]) -> Text:
    """Step time and loss over the last steps (left out on a short terminal: the table has them)."""
    if not steps:
        return Text()
    last = steps[-1]
    text = Text("step time ")
    text.append(sparkline([s.time_s for s in steps], SPARK_WIDTH), style="cyan")
    text.append(f" {fmt_seconds(last.time_s)}")
    text.append("\nloss      ")
    text.append(sparkline([s.loss for s in steps], SPARK_WIDTH), style="green")
    text.append(f" {fmt_loss(last.loss)}")
    return text


def memory_line(sample: MemorySample | None) -> list[Text | str] | None:
    """The latest memory sample by category, largest first; None before any arrives."""
    if sample is None:
        return None
    parts = sorted(
        ((name, sample.categories.get(name, 0)) for name in MEMORY_CATEGORIES if sample.categories.get(name)),
        key=lambda item: -item[1],
    )
    total = Text("memory ")
    total.append(fmt_bytes(sample.total_bytes), style="bold")
    fields: list[Text | str] = [total, *(f"{name.replace('_', ' ')} {fmt_bytes(size)}" for name, size in parts)]
    if sample.reserved_bytes is not None:
        fields.append(Text(f"(reserved {fmt_bytes(sample.reserved_bytes)})", style="dim"))
    return fields
