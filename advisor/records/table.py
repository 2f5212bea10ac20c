"""Many records of one kind as one record of columns: a deep step's memory samples, ops and modules.

A deep step of a model of 5001 small modules made 25,000 memory samples and 30,000 op records;
built, encoded, sent, checked, stored and folded one by one, they were most of what attaching
cost such a job beyond its deep steps' own Python (bench/module_count.py: wall 12.9-13.0 s with
neither sent, 17.3-19.2 s with both, 7.7-8.0 s bare). A ``RecordTable`` carries up to
``TABLE_ROWS`` of them as columns (field -> one value per row; ``rank`` and ``step`` once): the
probe appends values to lists instead of building a record per op, the wire carries one object,
the controller checks each column at once (``advisor.intake``), stores one row, and folds the rows
into its state as the records they stand for (``records()``), so every reader sees what it saw.

``RecordTable`` is in ``advisor.records.samples`` with the other kinds. ``TableBuilder`` is the
probes' side: ``add`` (or ``add_row``, positional) per row, ``take()`` the tables made;
``tabled(records)`` makes tables of records already built.
"""

from __future__ import annotations

from typing import Any

from advisor.records.jsonable import Record, _field_names
from advisor.records.samples import TABLE_ROWS, TABLE_SHARED, RecordTable

class TableBuilder:
    """Rows of one record kind, as columns, until ``take``; a new rank or step starts a new table."""

    def __init__(self, of: type[Record]) -> None:
        self.of = of.KIND
        self.names = tuple(n for n in _field_names(of) if n not in TABLE_SHARED)  # the fields each row gives
        self._new()
        self._done: list[RecordTable] = []
        self._open: tuple[int, int] | None = None  # (rank, step) of the open table

    def _new(self) -> None:
        self._columns: dict[str, list[Any]] = {n: [] for n in self.names}
        self._lists = list(self._columns.values())  # the columns in field order

    def __len__(self) -> int:
        return len(self._lists[0]) if self._lists else 0

    def add(self, rank: int, step: int, **values: Any) -> None:
        """One row (every field but rank and step given); a full table is closed."""
        self.add_row(rank, step, tuple(values[name] for name in self.names))

    def add_row(self, rank: int, step: int, values: tuple[Any, ...]) -> bool:
        """``add`` with the values in field order (``names``); whether a closed table waits."""
        if self._open != (rank, step):
            self._close()
            self._open = (rank, step)
        for column, value in zip(self._lists, values):
            column.append(value)
        if len(self) >= TABLE_ROWS:
            self._close()
        return bool(self._done)

    def take(self, *, close: bool = True) -> list[RecordTable]:
        """The tables made so far, the open one closed too unless ``close`` is False."""
        if close:
            self._close()
        done, self._done = self._done, []
        return done

    def _close(self) -> None:
        rows = len(self)
        if rows and self._open is not None:
            rank, step = self._open
            self._done.append(RecordTable(rank=rank, step=step, of=self.of, rows=rows, columns=self._columns))
            self._new()


def tabled(records: list[Record]) -> list[RecordTable]:
    """``records`` (of one kind in TABLE_KINDS) as tables, in order."""
    if not records:
        return []
    rows = TableBuilder(type(records[0]))
    for record in records:
        values = record.__dict__
        rows.add_row(values["rank"], values["step"], tuple(values[name] for name in rows.names))
    return rows.take()
