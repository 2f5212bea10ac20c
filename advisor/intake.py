"""Checking records that arrive from agents (socket, spill files) or are loaded from a store.

A signed frame proves who sent it, not that its record is well formed: an agent
of another version, a bug, or a forged-but-signed frame can carry a list where a
string belongs, NaN where a time belongs, or an integer SQLite cannot hold. Every
record is checked against its dataclass's field types before the controller
folds it into its state; a bad one raises ``RecordError``, and the caller drops
it, counts it and warns, so one bad record never costs the rest of the session.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from typing import Any, Callable, Mapping

from advisor.records.events import payload
from advisor.records.jsonable import INT_MAX as _INT_MAX, INT_MIN as _INT_MIN, type_problem as _check
from advisor.records.samples import RECORD_TYPES, TABLE_KINDS, TABLE_ROWS, TABLE_SHARED, Record, RecordTable

# Numeric fields that may be negative; every other count, size, time and index is >= 0.
_SIGNED = {"loss"}
# Fields that are divisors or sizes of a world somewhere downstream: at least 1.
_AT_LEAST_ONE = {"world_size", "group_size", "steps_covered"}
# Lists of global ranks: each >= 0, at most this many (the largest world a record describes).
_RANK_LISTS = {"group_ranks"}
# Maps of name -> seconds: every value a time, so >= 0 (the generic check only sees finite floats).
_SECONDS_MAPS = {"module_forward_s", "module_recompute_s"}
MAX_RANKS = 65536


class RecordError(ValueError):
    """A record that must be dropped, with the reason in one line."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type hint, required) of each field of a record class."""
    hints = _hints(cls)
    return tuple((f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls))  # type: ignore[arg-type]


def parse_record(kind: Any, data: Any) -> Record:
    """The record of ``kind`` built from ``data``, or ``RecordError`` saying what is wrong."""
    if not isinstance(kind, str) or kind not in RECORD_TYPES:
        raise RecordError(f"unknown record kind {str(kind)[:40]!r}")
    if not isinstance(data, Mapping):
        raise RecordError(f"{kind} record is a {type(data).__name__}, not an object")
    cls = RECORD_TYPES[kind]
    if cls is RecordTable:
        return _parse_table(data)
    values: dict[str, Any] = {}
    for name, hint, required in _fields(cls):
        if name not in data:
            if required:
                raise RecordError(f"{kind} record lacks {name!r}")
            continue
        value = data[name]
        problem = _value_problem(name, value, _checker(hint))
        if problem is not None:
            raise RecordError(f"{kind}.{name}: {problem}")
        values[name] = value
    try:
        record = cls(**values)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"{kind} record: {exc}") from None
    if kind == "event":
        _check_event(record)  # type: ignore[arg-type]
    return record


def _parse_table(data: Mapping[str, Any]) -> RecordTable:
    """A table of records (advisor/records/table.py), each column checked at once against its
    field's type as ``parse_record`` checks one record's: a table with one bad value is dropped."""
    rank, step, of, rows, columns = (data.get(k) for k in ("rank", "step", "of", "rows", "columns"))
    if type(rank) is not int or type(step) is not int or not 0 <= rank <= _INT_MAX or not _INT_MIN <= step <= _INT_MAX:
        raise RecordError("table.rank/step: not integers in range")
    if of not in TABLE_KINDS:
        raise RecordError(f"table.of: {str(of)[:40]!r} is not a kind a table holds ({', '.join(TABLE_KINDS)})")
    if type(rows) is not int or not 0 <= rows <= TABLE_ROWS:
        raise RecordError(f"table.rows: not an integer from 0 to {TABLE_ROWS}")
    if type(columns) is not dict:
        raise RecordError("table.columns is not an object")
    fields = {name: (hint, required) for name, hint, required in _fields(TABLE_KINDS[of])}
    for name, (hint, required) in fields.items():
        if name in TABLE_SHARED:
            continue
        if name not in columns:
            if required:
                raise RecordError(f"table of {of}: no column {name!r}")
            continue
        values = columns[name]
        if type(values) is not list or len(values) != rows:
            raise RecordError(f"table of {of}.{name}: not a list of {rows} values")
        problem = _column_problem(name, hint, values)
        if problem is not None:
            raise RecordError(f"table of {of}.{name}: {problem}")
    unknown = [name for name in columns if name not in fields or name in TABLE_SHARED]
    kept = {name: values for name, values in columns.items() if name not in unknown}  # a newer agent's: ignored
    return RecordTable(rank=rank, step=step, of=of, rows=rows, columns=kept)


def _column_problem(name: str, hint: Any, values: list[Any]) -> str | None:
    """What is wrong with a column of ``name`` (type ``hint``), or None. Integers and floats are
    checked in bulk; other types value by value as ``parse_record`` checks one."""
    if not values:
        return None
    if hint is int and all(type(v) is int for v in values):
        if not (_INT_MIN <= min(values) and max(values) <= _INT_MAX):
            return "integer out of the 64-bit range"
        return _range(name, min(values))  # the ranges are lower bounds
    if hint is float and all(type(v) is float for v in values):
        return _range(name, min(values)) if all(map(math.isfinite, values)) else "a value is not a finite number"
    check = _checker(hint)
    for index, value in enumerate(values):
        problem = _value_problem(name, value, check)
        if problem is not None:
            return f"row {index}: {problem}"
    return None


def _value_problem(name: str, value: Any, check: Callable[[Any], str | None]) -> str | None:
    """What is wrong with ``value`` of field ``name`` (``check``: its type's checker), or None: a
    record's field, or one row of a table's column."""
    problem = check(value)
    if problem is None and name in _RANK_LISTS:
        problem = _ranks(value)
    elif problem is None and (type(value) is int or type(value) is float):  # only numbers have a range
        problem = _range(name, value)
    if problem is None and name in _SECONDS_MAPS:
        problem = next((f"[{k[:40]!r}] {v} is negative" for k, v in value.items() if v < 0), None)
    return problem


def admit(record: Record) -> Record:
    """``record`` as the controller would take it from an agent: through its wire form (JSON,
    NaN refused) and ``parse_record``. For records the controller makes from files (imports),
    which must pass the same checks as live ones; ``RecordError`` says why one cannot."""
    try:
        data = json.loads(json.dumps(record.to_dict(), allow_nan=False))
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise RecordError(f"{record.KIND} record: {exc}"[:300]) from None
    return parse_record(record.KIND, data)


@functools.cache
def _checker(hint: Any) -> Callable[[Any], str | None]:
    """A function checking a top-level field value against ``hint``; the common cases are direct."""
    if hint is int or hint == int | None:
        nullable = hint is not int

        def check_int(value: Any) -> str | None:
            if type(value) is int:
                return None if _INT_MIN <= value <= _INT_MAX else "integer out of the 64-bit range"
            return None if value is None and nullable else _check(value, hint, 0)
        return check_int
    if hint is float or hint == float | None:
        nullable = hint is not float

        def check_float(value: Any) -> str | None:
            if type(value) is float:
                return None if math.isfinite(value) else f"{value} is not a finite number"
            return None if value is None and nullable else _check(value, hint, 0)
        return check_float
    if hint is str or hint == str | None:
        nullable = hint is not str
        return lambda value: None if type(value) is str or (value is None and nullable) else _check(value, hint, 0)
    if hint is bool:
        return lambda value: None if type(value) is bool else _check(value, hint, 0)
    if hint == dict[str, int]:
        def check_int_map(value: Any) -> str | None:
            # A deep step's memory samples carry one each (25,000 at 5001 modules).
            if type(value) is dict and all(type(v) is int and _INT_MIN <= v <= _INT_MAX for v in value.values()):
                return None
            return _check(value, hint, 0)
        return check_int_map
    if hint == list[list[int]]:
        def check_shapes(value: Any) -> str | None:
            # Ops' input shapes (30,000 op records at 5001 modules).
            if type(value) is list and all(type(s) is list and all(type(d) is int and _INT_MIN <= d <= _INT_MAX
                                                                    for d in s) for s in value):
                return None
            return _check(value, hint, 0)
        return check_shapes
    if hint == dict[str, float]:
        def check_float_map(value: Any) -> str | None:
            if type(value) is dict and all(type(v) is float and math.isfinite(v) for v in value.values()):
                return None
            return _check(value, hint, 0)
        return check_float_map
    return lambda value: _check(value, hint, 0)


def _range(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if name in _AT_LEAST_ONE and value < 1:
        return f"{value} is below 1"
    if name not in _SIGNED and value < 0:
        return f"{value} is negative"
    return None


def _ranks(value: Any) -> str | None:
    if value is None:
        return None
    if len(value) > MAX_RANKS:
        return f"{len(value)} ranks, more than {MAX_RANKS}"
    return next((f"rank {r} is negative" for r in value if r < 0), None)


# Numeric payload fields that may be negative (an exit code: a signal's is).
_SIGNED_PAYLOAD = {"code"}


def _check_event(event: Any) -> None:
    """The event's typed payload decodes (``advisor.records.events``: the records the readers take
    by attribute) and its numbers are not negative."""
    try:
        decoded = payload(event)
    except ValueError as exc:
        raise RecordError(f"event {event.name}: {str(exc)[:300]}") from None
    if decoded is None:
        return
    for f in dataclasses.fields(decoded):
        value = getattr(decoded, f.name)
        problem = None if f.name in _SIGNED_PAYLOAD else _range(f.name, value)
        if problem is not None:
            raise RecordError(f"event {event.name}.{f.name}: {problem}")
