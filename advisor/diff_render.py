"""Rich rendering of an ``advisor.diff/1`` document (``advisor diff A B``)."""

from __future__ import annotations

from typing import Any, Mapping

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from advisor.records.units import fmt_bytes, fmt_seconds
from advisor.rich_text import name_text, text_cells


def _seconds(value: float | None) -> str:
    return fmt_seconds(value)


def _bytes(value: float | None) -> str:
    return fmt_bytes(value)


def _delta(c: Mapping[str, Any], fmt: Any, *, worse_when_up: bool = True) -> Text:
    if c.get("abs") is None:
        return Text("-")
    sign = "+" if c["abs"] > 0 else "-" if c["abs"] < 0 else "±"
    rel = f" ({c['rel']:+.1%})" if c.get("rel") is not None else ""
    style = "" if c["abs"] == 0 else ("red" if (c["abs"] > 0) == worse_when_up else "green")
    return Text(f"{sign}{fmt(abs(c['abs']))}{rel}", style=style)


def _row(table: Table, label: str, c: Mapping[str, Any], fmt: Any) -> None:
    table.add_row(*text_cells(label, fmt(c.get("a")), fmt(c.get("b")), _delta(c, fmt)))


def _table(title: str) -> Table:
    table = Table(title=title, expand=False)
    table.add_column("")
    for name in ("A", "B", "change"):
        table.add_column(name, justify="right")
    return table


def diff_renderables(diff: Mapping[str, Any]) -> list[Any]:
    a, b = diff["a"], diff["b"]
    head = Text()
    for label, side in (("A", a), ("B", b)):  # ids and scripts are the user's: text, never markup
        if label == "B":
            head.append("\n")
        head.append(label, style="bold")
        head.append_text(name_text(f" {side['id']} · {side.get('script')} · {side.get('steps')} steps"
                                   + (f" · imported ({side['imported_from']})" if side.get("imported_from") else "")))
    parts: list[Any] = [Panel(head, title="advisor diff", expand=False)]
    time = _table("step time and phases (per steady step)")
    _row(time, "step (median)", diff["step_time"], _seconds)
    if diff.get("mean_step_time"):
        _row(time, "step (mean)", diff["mean_step_time"], _seconds)
    for key, c in diff["phases"].items():  # means: they add up to the mean step
        _row(time, f"  {key[:-2]} (mean)", c, _seconds)
    parts.append(time)
    memory = _table("memory at the peak")
    _row(memory, "peak", diff["peak_memory"], _bytes)
    for key, c in diff.get("memory_categories", {}).items():
        if c["a"] or c["b"]:
            _row(memory, key, c, _bytes)
    parts.append(memory)
    if diff["ops"]:
        ops = Table(title="ops whose time changed most (per step)", expand=False)
        for name in ("op", "phase", "A", "B", "change"):
            ops.add_column(name, justify="left" if name in ("op", "phase") else "right")
        for row in diff["ops"]:
            c = row["time_s"]
            ops.add_row(*text_cells(row["name"], row["phase"], _seconds(c["a"]), _seconds(c["b"]), _delta(c, _seconds)))
        parts.append(ops)
    if diff["collectives"]:
        coll = Table(title="collectives (per step)", expand=False)
        for name in ("op", "calls A", "calls B", "size B", "time A", "time B", "exposed A", "exposed B",
                     "exposed change"):
            coll.add_column(name, justify="left" if name == "op" else "right")
        for row in diff["collectives"]:
            coll.add_row(name_text(row["op"]), f"{row['count']['a']:.1f}", f"{row['count']['b']:.1f}",
                         _bytes(row["bytes"]["b"]), _seconds(row["time_s"]["a"]), _seconds(row["time_s"]["b"]),
                         _seconds(row["exposed_s"]["a"]), _seconds(row["exposed_s"]["b"]),
                         _delta(row["exposed_s"], _seconds))
        parts.append(coll)
    advice = Table(title="diagnosis and recommendations", expand=False)
    advice.add_column("")
    advice.add_column("A")
    advice.add_column("B")
    diag = diff["diagnosis"]
    advice.add_row(*text_cells("bottleneck", *((d or {}).get("bottleneck") or "-" for d in (diag["a"], diag["b"]))))
    advice.add_row(*text_cells("summary", *((d or {}).get("summary") or "-" for d in (diag["a"], diag["b"]))))
    recs = diff["recommendations"]
    advice.add_row(*text_cells("recommendations", *(", ".join(str(r["id"]) for r in recs[k]) or "-"
                                                    for k in ("a", "b"))))
    parts.append(advice)
    gate = diff.get("gate")
    if gate and gate.get("spec"):
        if gate["failures"]:  # the reasons themselves go to stderr, one line each
            parts.append(name_text(f"gate {gate['spec']}: {len(gate['failures'])} threshold(s) crossed", "red"))
        else:
            parts.append(name_text(f"gate {gate['spec']}: passed", "green"))
    return parts


def print_diff(diff: Mapping[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(Group(*diff_renderables(diff)))
