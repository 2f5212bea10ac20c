"""The one JSON helper of the records: plain JSON types out, checked types in.

Every record family (samples.py, advice.py, results.py, commands.py, events.py, settings.py)
serialises through ``to_json``. Records that cross a boundary inside the advisor (recommendations,
commands, apply results, event payloads, the agent's settings) rebuild through ``decode``, which
checks every field against its type hint, nested records included, and raises ``ValueError``
naming the path of the first wrong value; keys a newer sender added are ignored (``decode_checked``
also returns them, for the caller to warn about). The measurement records rebuild through
``Record.from_dict``; the controller checks their values once at its edge against their field
types (``type_problem``, ``advisor/intake.py``). NaN handling and forward compatibility are
decided here, once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, ClassVar, Literal, Mapping, TypeVar

R = TypeVar("R", bound="Record")
T = TypeVar("T")


_PLAIN: frozenset[type] = frozenset({str, int, bool, type(None)})


def to_json(value: Any) -> Any:
    """Plain JSON types only: NaN and infinities become None, tuples lists, dataclasses dicts.

    Exact built-in types are tried first, by ``type()``: the training thread encodes several
    records a step, and ``isinstance(value, Mapping)`` (an ABC check) per value cost a 2.6 ms CUDA
    step about 0.7 ms."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    # Plain items as they are, without a call each (a memory sample's categories, an op's shapes).
    if kind is dict:
        return {k if type(k) is str else str(k): v if type(v) in _PLAIN else to_json(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [v if type(v) in _PLAIN else to_json(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def column_json(values: list[Any]) -> list[Any]:
    """``to_json(values)`` for a table's column: the list itself when every value is plain (a
    finite float included), else a copy whose non-plain values are converted once per distinct
    object. A deep step's 30,000 op rows name a handful of shape lists; converted row by row they
    were 85,000 fresh lists, kept alive for the channel's ``RECENT_S``, and the full garbage
    collections they set off cost a 5001-module job 0.4 s."""
    out: list[Any] | None = None
    converted: dict[int, Any] = {}
    for i, value in enumerate(values):
        kind = type(value)
        if kind in _PLAIN or (kind is float and math.isfinite(value)):
            if out is not None:
                out.append(value)
            continue
        if out is None:
            out = values[:i]
        known = converted.get(id(value), converted)
        if known is converted:
            known = converted[id(value)] = to_json(value)
        out.append(known)
    return values if out is None else out


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """The dataclass ``cls``'s field names in order (``dataclasses.fields`` rebuilds its tuple per call)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def known_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The items of ``data`` that name a field of the dataclass ``cls`` (newer senders may add keys)."""
    names = set(_field_names(cls))
    return {k: v for k, v in data.items() if k in names}


class Record:
    """Mixin for frozen dataclasses whose JSON form is their fields: ``to_dict`` / ``from_dict``."""

    KIND: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        # Plain values as they are, without a call each: a deep step of a model of thousands of
        # modules emits tens of thousands of records on the training thread.
        values = self.__dict__
        out = {}
        for name in _field_names(type(self)):
            value = values[name]
            kind = type(value)
            out[name] = value if kind in _PLAIN or (kind is float and math.isfinite(value)) else to_json(value)
        return out

    def with_fields(self: R, **changes: Any) -> R:
        """A copy with ``changes`` (field names) made by copying the instance's dict: no
        ``__init__`` call per field, as ``dataclasses.replace`` makes (the agent's step sample gets
        its loss this way once a step, on the training thread). The fields' values are shared."""
        unknown = changes.keys() - self.__dict__.keys()
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__, **changes)
        return clone

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """Build from a dict, ignoring unknown keys (newer agents may add fields)."""
        return cls(**known_fields(cls, data))


MAX_DEPTH = 24  # nesting of free-form dicts and lists (the agents send at most a few levels)
INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # what SQLite and every JSON reader can hold


def type_problem(value: Any, hint: Any, depth: int = 0) -> str | None:
    """None when the decoded JSON ``value`` fits the type ``hint``, else what is wrong (one line)."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if hint is Any:
        return json_problem(value, depth)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        problems = [type_problem(value, option, depth) for option in options if option is not type(None)]
        return None if any(p is None for p in problems) else problems[0]
    if hint is bool:
        return None if isinstance(value, bool) else f"expected true/false, got {type(value).__name__}"
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {type(value).__name__}"
        return None if INT_MIN <= value <= INT_MAX else "integer out of the 64-bit range"
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number, got {type(value).__name__}"
        return json_problem(value, depth)
    if hint is str:
        return None if isinstance(value, str) else f"expected a string, got {type(value).__name__}"
    if origin is dict or (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
        if not isinstance(value, dict):
            return f"expected an object, got {type(value).__name__}"
        if origin is not dict:  # a nested record: its own fields are checked when it is decoded
            return None
        _, item = typing.get_args(hint)
        for key, entry in value.items():
            if not isinstance(key, str):
                return "object key is not a string"
            problem = type_problem(entry, item, depth + 1)
            if problem is not None:
                return f"[{key[:40]!r}] {problem}"
        return None
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return f"expected a list, got {type(value).__name__}"
        (item,) = typing.get_args(hint)[:1]
        for entry in value:
            problem = type_problem(entry, item, depth + 1)
            if problem is not None:
                return problem
        return None
    return f"unsupported field type {hint!r}"  # a record type this module does not know yet


def json_problem(value: Any, depth: int = 0) -> str | None:
    """Free-form JSON: finite numbers, 64-bit integers, bounded nesting."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if value is None or isinstance(value, (bool, str)):
        return None
    if isinstance(value, int):
        return None if INT_MIN <= value <= INT_MAX else "integer out of the 64-bit range"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number"
    if isinstance(value, dict):
        for key, entry in value.items():
            problem = json_problem(entry, depth + 1) if isinstance(key, str) else "object key is not a string"
            if problem is not None:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for entry in value:
            problem = json_problem(entry, depth + 1)
            if problem is not None:
                return problem
        return None
    return f"{type(value).__name__} is not JSON"



@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(cls: type[T], data: Any, *, where: str = "", unknown: list[str] | None = None) -> T:
    """The dataclass ``cls`` built from JSON ``data``, every field checked against its type hint.

    Missing fields take their defaults (a required one missing is an error); unknown keys are
    ignored; a null where a plain ``float`` belongs is NaN (``to_json`` writes NaN and infinities
    as null); a field typed as a record is decoded the same way (through its own ``from_dict``
    when it defines one: a record whose JSON shape is not its fields). ``ValueError`` names the
    path of the first wrong value, ``where`` first. ``unknown``, when given, collects the paths
    (below ``where``) of the keys no field names, nested records' included."""
    where = where or cls.__name__
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    if unknown is not None:
        names = _field_names(cls)
        unknown.extend(str(k) for k in data if k not in names)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}.{f.name}: missing")
            continue
        inner: list[str] | None = [] if unknown is not None else None
        values[f.name] = _value(hints[f.name], data[f.name], f"{where}.{f.name}", inner)
        if inner:
            unknown.extend(f"{f.name}.{key}" for key in inner)  # type: ignore[union-attr]
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _value(hint: Any, value: Any, where: str, unknown: list[str] | None = None) -> Any:
    """``value`` as the type ``hint`` says (lists to tuples, records decoded), or ``ValueError``."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        problems = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _value(option, value, where, unknown)
            except ValueError as exc:
                problems.append(str(exc))
        raise ValueError(problems[0] if problems else f"{where}: expected null")
    if origin is Literal:
        if value in typing.get_args(hint) and type(value) in {type(a) for a in typing.get_args(hint)}:
            return value
        raise ValueError(f"{where}: {str(value)[:40]!r} is not one of {list(typing.get_args(hint))}")
    if hint is bool:
        if type(value) is bool:
            return value
        raise ValueError(f"{where}: expected true/false, got {type(value).__name__}")
    if hint is int:
        if type(value) is int:
            return value
        raise ValueError(f"{where}: expected an integer, got {type(value).__name__}")
    if hint is float:
        if value is None:  # ``to_json`` writes NaN and the infinities as null: read back as NaN
            return math.nan
        if type(value) in (int, float) and math.isfinite(value):
            return float(value)
        raise ValueError(f"{where}: expected a finite number, got {str(value)[:40]}")
    if hint is str:
        if type(value) is str:
            return value
        raise ValueError(f"{where}: expected a string, got {type(value).__name__}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        item = typing.get_args(hint)[0]
        items = [_value(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        key_type, item = typing.get_args(hint)
        out = {}
        for key, v in value.items():
            if key_type is int:  # JSON keys are strings: a rank map's "0" is rank 0
                try:
                    key = int(key)
                except (TypeError, ValueError):
                    raise ValueError(f"{where}: key {str(key)[:40]!r} is not an integer") from None
            elif not isinstance(key, str):
                raise ValueError(f"{where}: object key is not a string")
            out[key] = _value(item, v, f"{where}[{str(key)[:40]!r}]")
        return out
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        custom = hint.__dict__.get("from_dict")
        if custom is not None:
            try:
                return hint.from_dict(value)  # type: ignore[attr-defined]
            except (KeyError, TypeError) as exc:
                raise ValueError(f"{where}: {exc}") from None
        return decode(hint, value, where=where, unknown=unknown)
    raise ValueError(f"{where}: no JSON form for {hint!r}")


def decode_checked(cls: type[T], data: Any, *, where: str) -> tuple[T, list[str]]:
    """``decode``, and the keys ``data`` has that no field of ``cls`` (or of a nested record)
    names, for the caller to warn about: a newer controller's setting an older agent ignores."""
    unknown: list[str] = []
    return decode(cls, data, where=where, unknown=unknown), sorted(unknown)


class Checked(Record):
    """Mixin for records decoded with their types checked (``decode``): what crosses a boundary
    inside the advisor (commands, apply outcomes, event payloads)."""

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        return decode(cls, data)
