"""Steps in the session store: every step's figures kept, its full record only while recent.

A step record is about 600 bytes of JSON, and one arrives per rank per step: a week at a step a
second was 360 MB per rank of step records alone, though no reader ever builds more than the last
``MAX_LIVE_STEPS`` of a rank into records (older ones are only summed, ``StepTotals``). So a step
is written twice:

- ``step_series``: one compact row per step of every rank, kept for the whole run: its index,
  time, loss, whether deep, and its phases, as typed columns (about 80 bytes). This is the series
  the summary and any later reader use for every step's time and loss.
- ``step_records``: the full JSON record, kept for the last ``MAX_LIVE_STEPS`` steps of each rank;
  older rows are deleted in batches. Their own table, so the pages they free are whole pages that
  SQLite reuses for the next rows: the file stops growing by them.

Both rows of a step share their id, so a reader sums from the series exactly the steps whose
record was deleted. Sessions written before this layout keep their steps in ``records`` (the
reader's legacy path in ``advisor.store``).
"""

from __future__ import annotations

import json
import math
import sqlite3
from array import array
from typing import Any

from advisor.records.samples import PHASES, Record
from advisor.state import MAX_LIVE_STEPS
from advisor.step_totals import CATEGORIES, StepTotals, category

TRIM_SLACK = 500  # a rank's full records are trimmed back to MAX_LIVE_STEPS once this many over

SCHEMA = """
CREATE TABLE IF NOT EXISTS step_records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    rank INTEGER,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS step_series (
    id INTEGER PRIMARY KEY,
    rank INTEGER,
    idx INTEGER,
    time_s REAL,
    loss REAL,
    deep INTEGER,
    data_s REAL, forward_s REAL, backward_s REAL, optimizer_s REAL, other_s REAL
);
CREATE INDEX IF NOT EXISTS step_records_rank ON step_records(rank, id);
"""

_NUMBER = (int, float)


def has_layout(conn: sqlite3.Connection) -> bool:
    """Whether the file keeps its steps in this module's tables (else in ``records``)."""
    row = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'step_series'").fetchone()
    return bool(row and row[0])


class StepWriter:
    """The writer's side: inserts both rows of each step and trims old full records."""

    def __init__(self) -> None:
        self._held: dict[Any, int] = {}  # rank -> full records stored (this writer's count)

    def insert(self, conn: sqlite3.Connection, record: Record) -> None:
        data = record.to_dict()
        text = json.dumps(data)
        rank = data.get("rank")
        cursor = conn.execute("INSERT INTO step_records(rank, data) VALUES (?, ?)", (rank, text))
        phases = data.get("phases") if isinstance(data.get("phases"), dict) else {}
        conn.execute(
            "INSERT INTO step_series(id, rank, idx, time_s, loss, deep, data_s, forward_s, backward_s, optimizer_s,"
            " other_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (cursor.lastrowid, rank, data.get("index"), data.get("time_s"), _finite(data.get("loss")),
             int(bool(data.get("deep"))), *(_finite(phases.get(k)) for k in PHASES)),
        )
        self._held[rank] = self._held.get(rank, 0) + 1

    def trim(self, conn: sqlite3.Connection) -> None:
        """Delete each rank's full records older than its last ``MAX_LIVE_STEPS``."""
        for rank, held in self._held.items():
            if held < MAX_LIVE_STEPS + TRIM_SLACK:
                continue
            row = conn.execute("SELECT id FROM step_records WHERE rank IS ? ORDER BY id DESC LIMIT 1 OFFSET ?",
                               (rank, MAX_LIVE_STEPS)).fetchone()
            if row is not None:
                conn.execute("DELETE FROM step_records WHERE rank IS ? AND id <= ?", (rank, row[0]))
            self._held[rank] = MAX_LIVE_STEPS


def _finite(value: Any) -> float | None:
    """A JSON number as SQLite keeps it; None for a missing or non-finite one (JSON has no NaN)."""
    if type(value) in _NUMBER and math.isfinite(value):
        return float(value)
    return None


def _first_full_ids(conn: sqlite3.Connection) -> dict[Any, int]:
    """rank -> the id of its oldest full step record (the series before it is only in the series)."""
    return dict(conn.execute("SELECT rank, min(id) FROM step_records GROUP BY rank").fetchall())


def sum_series(conn: sqlite3.Connection) -> tuple[dict[int, StepTotals], int]:
    """Each rank's summary figures over the steps whose full record was trimmed, and how many of
    those rows could not be counted (wrong types: a damaged or hand-edited file)."""
    firsts = _first_full_ids(conn)
    out: dict[int, StepTotals] = {}
    bad = 0
    for (rank,) in conn.execute("SELECT DISTINCT rank FROM step_series").fetchall():
        if not isinstance(rank, int):
            continue
        limit = firsts.get(rank, 1 << 62)
        rows = conn.execute("SELECT idx, time_s, loss, deep, data_s, forward_s, backward_s, optimizer_s, other_s "
                            "FROM step_series WHERE rank = ? AND id < ? ORDER BY id", (rank, limit))
        totals, seen = fold_steps(rows)
        bad += seen - totals.count
        if seen:
            out[rank] = totals
    return out, bad


def fold_steps(rows: Any) -> tuple[StepTotals, int]:
    """``StepTotals`` of rows (index, time_s, loss, deep, *PHASES), and how many rows there were;
    a row with a field of the wrong type is not counted (as ``advisor.intake`` would refuse it)."""
    times: dict[str, array] = {name: array("d") for name in CATEGORIES}
    sums: dict[str, list[float]] = {c: [0.0] * len(PHASES) for c in times}
    last: tuple[int, Any] | None = None
    previous: tuple[int, bool] | None = None
    seen = 0
    for index, time_s, loss, deep, *phases in rows:
        seen += 1
        if (type(index) is not int or index < 0 or type(time_s) not in _NUMBER or not 0 <= time_s < math.inf
                or (loss is not None and type(loss) not in _NUMBER)
                or any(v is not None and (type(v) not in _NUMBER or not math.isfinite(v)) for v in phases)):
            continue
        kind = category(index, bool(deep), previous)
        previous = (index, bool(deep))
        times[kind].append(time_s)
        row = sums[kind]
        for k, v in enumerate(phases):
            row[k] += v or 0.0
        last = (index, loss)
    totals = StepTotals()
    for name, values in times.items():
        totals.add_many(name, values, dict(zip(PHASES, sums[name])))
    if last is not None:
        totals.set_last(*last, deep=previous[1] if previous is not None else None)
    return totals, seen
