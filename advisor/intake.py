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
import math
import types
import typing
from typing import Any, Callable, Mapping

from advisor.records.events import payload
from advisor.records.samples import RECORD_TYPES, Record

MAX_DEPTH = 24  # nesting of free-form dicts and lists (the agents send at most a few levels)
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1  # what SQLite and every JSON reader can hold
# Numeric fields that may be negative; every other count, size, time and index is >= 0.
_SIGNED = {"loss"}
# Fields that are divisors or sizes of a world somewhere downstream: at least 1.
_AT_LEAST_ONE = {"world_size", "group_size"}
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
    values: dict[str, Any] = {}
    for name, hint, required in _fields(cls):
        if name not in data:
            if required:
                raise RecordError(f"{kind} record lacks {name!r}")
            continue
        value = data[name]
        problem = _checker(hint)(value)
        if problem is None:
            problem = _ranks(value) if name in _RANK_LISTS else _range(name, value)
        if problem is None and name in _SECONDS_MAPS:
            problem = next((f"[{k[:40]!r}] {v} is negative" for k, v in value.items() if v < 0), None)
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
    if hint is str:
        return lambda value: None if type(value) is str else _check(value, hint, 0)
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


def _check(value: Any, hint: Any, depth: int) -> str | None:
    """None when ``value`` fits the type ``hint``, else what is wrong."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if hint is Any:
        return _check_json(value, depth)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        problems = [_check(value, option, depth) for option in options if option is not type(None)]
        return None if any(p is None for p in problems) else problems[0]
    if hint is bool:
        return None if isinstance(value, bool) else f"expected true/false, got {type(value).__name__}"
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {type(value).__name__}"
        return None if _INT_MIN <= value <= _INT_MAX else "integer out of the 64-bit range"
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number, got {type(value).__name__}"
        return _check_json(value, depth)
    if hint is str:
        return None if isinstance(value, str) else f"expected a string, got {type(value).__name__}"
    if origin is dict:
        if not isinstance(value, dict):
            return f"expected an object, got {type(value).__name__}"
        _, item = typing.get_args(hint)
        for key, entry in value.items():
            if not isinstance(key, str):
                return "object key is not a string"
            problem = _check(entry, item, depth + 1)
            if problem is not None:
                return f"[{key[:40]!r}] {problem}"
        return None
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return f"expected a list, got {type(value).__name__}"
        (item,) = typing.get_args(hint)[:1]
        for entry in value:
            problem = _check(entry, item, depth + 1)
            if problem is not None:
                return problem
        return None
    return f"unsupported field type {hint!r}"  # a record type this module does not know yet


def _check_json(value: Any, depth: int) -> str | None:
    """Free-form JSON: finite numbers, 64-bit integers, bounded nesting."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if value is None or isinstance(value, (bool, str)):
        return None
    if isinstance(value, int):
        return None if _INT_MIN <= value <= _INT_MAX else "integer out of the 64-bit range"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number"
    if isinstance(value, dict):
        for key, entry in value.items():
            problem = _check_json(entry, depth + 1) if isinstance(key, str) else "object key is not a string"
            if problem is not None:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for entry in value:
            problem = _check_json(entry, depth + 1)
            if problem is not None:
                return problem
        return None
    return f"{type(value).__name__} is not JSON"


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
