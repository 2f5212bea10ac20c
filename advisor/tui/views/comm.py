"""Communication: collectives by kind (bytes, time, bus bandwidth against the link's ceiling,
exposed time), per-rank exposed time and skew, and the straggler by name."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from advisor.records.units import fmt_bytes, fmt_rate, fmt_seconds
from advisor.tui.chart import Chart
from advisor.tui.fit_table import Column, FitTable
from advisor.tui.flow import Flow
from advisor.tui.view_model import ViewModel

COLLECTIVE_COLUMNS = [Column(key="op", label="collective"), Column(key="calls", label="calls", drop=3),
                      Column(key="bytes", label="bytes", drop=2), Column(key="time", label="time"),
                      Column(key="exposed", label="exposed"), Column(key="busbw", label="bus bw", drop=1),
                      Column(key="ceiling", label="ceiling", drop=4)]


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


def summary_lines(model: ViewModel) -> list[list[Any]]:
    s = model.straggler
    if model.world_size < 2:
        return [[Text("one rank: no collectives between ranks", style="dim")]]
    if s:
        who = Text("straggler ", style="dim")
        who.append(f"rank {s['rank']}", style="bold red")
        who.append(":")
        lines: list[list[Any]] = [[who, f"the others wait {fmt_seconds(s.get('wait_caused_per_step_s'))} per step for it",
                                   f"skew {fmt_seconds(s.get('skew_s'))} per call over {s.get('matched_calls')} matched calls"]]
    else:
        lines = [[Text("no straggler found (no collectives matched across ranks)", style="dim")]]
    for row in model.comm:
        lines.append([Text(f"rank {row['rank']}:", style="dim"), f"step {fmt_seconds(row['step_time_s'])}",
                      f"comm {fmt_seconds(row['comm_s'])}",
                      f"exposed {fmt_seconds(row['exposed_s'])} ({row['exposed_share']:.0%})"])
    return lines


def kinds_table(kinds: list[dict[str, Any]]) -> Table:
    table = Table("op", "time", "exposed", "bus bw", box=None, pad_edge=False)
    for column in table.columns[1:]:
        column.no_wrap = True
    for k in kinds:
        table.add_row(k["op"], fmt_seconds(k["time_s"]), fmt_seconds(k["exposed_s"]), bandwidth(k["busbw"]))
    return table


class CommView(Vertical):
    DEFAULT_CSS = """
    CommView > #comm-summary { height: auto; max-height: 8; padding: 0 1; }
    CommView > #comm-chart { height: 1fr; }
    CommView > #collectives-table { height: auto; max-height: 12; }
    CommView > .fit-note { height: 1; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Flow(id="comm-summary")
        yield Chart(id="comm-chart")
        table = FitTable(COLLECTIVE_COLUMNS, title="collectives by kind", id="collectives-table")
        yield table
        yield table.note

    @property
    def summary_plain(self) -> str:
        return self.query_one("#comm-summary", Flow).plain

    def update_model(self, model: ViewModel) -> None:
        self.query_one("#comm-summary", Flow).set_lines(summary_lines(model))
        kinds = by_kind(model.collectives, model.rank)
        self.query_one(FitTable).set_rows([
            [k["op"], str(k["count"]), fmt_bytes(k["bytes"]), fmt_seconds(k["time_s"]), fmt_seconds(k["exposed_s"]),
             bandwidth(k["busbw"]), bandwidth(k["bench_busbw"]) if k["bench_busbw"] else "not measured"]
            for k in kinds])
        chart = self.query_one(Chart)
        if not kinds:
            chart.draw(None, Text(f"no collectives on rank {model.rank}", style="dim"))
            return

        def plot(plt: Any) -> None:
            names = [k["op"] for k in kinds]
            plt.multiple_bar(names, [[k["time_s"] * 1e3 for k in kinds], [k["exposed_s"] * 1e3 for k in kinds]],
                             color=["cyan", "red"])
            plt.title(f"collectives on rank {model.rank}: time summed over the recorded steps")
            plt.xlabel("collective")
            plt.ylabel("ms")

        chart.draw(plot, kinds_table(kinds), legend=[("time", "cyan"), ("exposed (not overlapped)", "red")])
