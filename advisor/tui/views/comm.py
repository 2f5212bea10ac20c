"""Communication: collectives by kind (bytes, time, bus bandwidth against the link's ceiling,
exposed time), per-rank exposed time and skew, and the straggler by name."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from advisor.records.units import fmt_bytes, fmt_rate, fmt_seconds
from advisor.rich_text import name_text
from advisor.tui.chart import Chart
from advisor.tui.view_model import ViewModel


def by_kind(rows: list[dict[str, Any]], rank: int) -> list[dict[str, Any]]:
    """The rank's collectives summed per op: calls, bytes moved, time, exposed, and the bus
    bandwidth of its largest transfer with that size's ``bench_busbw`` ceiling (B/s)."""
    kinds: dict[str, dict[str, Any]] = defaultdict(lambda: {"count": 0, "bytes": 0, "time_s": 0.0, "exposed_s": 0.0,
                                                             "busbw": None, "bench_busbw": None, "_size": -1})
    for row in rows:
        if row.get("rank") != rank:
            continue
        k = kinds[row["op"]]
        k["count"] += row["count"]
        k["bytes"] += row["bytes"] * row["count"]
        k["time_s"] += row["time_s"]
        k["exposed_s"] += row["exposed_s"]
        if row["bytes"] > k["_size"]:
            k["_size"], k["busbw"], k["bench_busbw"] = row["bytes"], row.get("busbw"), row.get("bench_busbw")
    out = [{"op": op, **{key: v for key, v in k.items() if key != "_size"}} for op, k in kinds.items()]
    out.sort(key=lambda k: -k["time_s"])
    return out


def bandwidth(value: float | None) -> str:
    """Bytes/s as the report gives them (``fmt_rate``: decimal prefixes, as nccl-tests quotes them)."""
    return "—" if not value else fmt_rate(value)


def summary_text(model: ViewModel) -> Text:
    text = Text()
    s = model.straggler
    if model.world_size < 2:
        text.append("one rank: no collectives between ranks", style="dim")
        return text
    if s:
        text.append("straggler ", style="dim")
        text.append(f"rank {s['rank']}", style="bold red")
        text.append(f": the others wait {fmt_seconds(s.get('wait_caused_per_step_s'))} per step for it · skew "
                    f"{fmt_seconds(s.get('skew_s'))} per call over {s.get('matched_calls')} matched calls")
    else:
        text.append("no straggler found (no collectives matched across ranks)", style="dim")
    for row in model.comm:
        text.append(f"\nrank {row['rank']}: ", style="dim")
        text.append(f"step {fmt_seconds(row['step_time_s'])} · comm {fmt_seconds(row['comm_s'])} · exposed "
                    f"{fmt_seconds(row['exposed_s'])} ({row['exposed_share']:.0%})")
    return text


def kinds_table(kinds: list[dict[str, Any]]) -> Table:
    table = Table("op", "time", "exposed", "bus bw", box=None, pad_edge=False)
    for k in kinds:
        table.add_row(k["op"], fmt_seconds(k["time_s"]), fmt_seconds(k["exposed_s"]), bandwidth(k["busbw"]))
    return table


class CommView(Vertical):
    DEFAULT_CSS = """
    CommView > #comm-summary { height: auto; max-height: 8; padding: 0 1; }
    CommView > #comm-chart { height: 1fr; }
    CommView > #collectives-table { height: auto; max-height: 12; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="comm-summary")
        yield Chart(id="comm-chart")
        yield DataTable(id="collectives-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one("#collectives-table", DataTable)
        for label in ("collective", "calls", "bytes", "time", "exposed", "bus bw", "ceiling"):
            table.add_column(label, key=label)

    @property
    def summary_plain(self) -> str:
        return str(self.query_one("#comm-summary", Static).content)

    def update_model(self, model: ViewModel) -> None:
        self.query_one("#comm-summary", Static).update(summary_text(model))
        kinds = by_kind(model.collectives, model.rank)
        table = self.query_one("#collectives-table", DataTable)
        table.clear()
        for k in kinds:
            table.add_row(name_text(k["op"]), str(k["count"]), fmt_bytes(k["bytes"]), fmt_seconds(k["time_s"]),
                          fmt_seconds(k["exposed_s"]), bandwidth(k["busbw"]),
                          bandwidth(k["bench_busbw"]) if k["bench_busbw"] else "not measured")
        chart = self.query_one(Chart)
        if not kinds:
            chart.draw(None, Text(f"no collectives on rank {model.rank}", style="dim"))
            return

        def plot(plt: Any) -> None:
            names = [k["op"] for k in kinds]
            plt.multiple_bar(names, [[k["time_s"] * 1e3 for k in kinds], [k["exposed_s"] * 1e3 for k in kinds]],
                             labels=["time", "exposed"], color=["cyan", "red"])
            plt.title(f"collectives on rank {model.rank}: total and exposed time (ms)")

        chart.draw(plot, kinds_table(kinds))
