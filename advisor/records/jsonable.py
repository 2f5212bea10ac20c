"""The one JSON helper of the records: plain JSON types out, unknown keys tolerated in.

Every record family (samples.py, advice.py, results.py, commands.py) serialises
through ``to_json`` and rebuilds through ``Record.from_dict``, so NaN handling
and forward compatibility (a newer agent adding a field) are decided once.
Values that come from another process are checked against their field's type hint
(``type_problem``): the controller's intake for records (``advisor/intake.py``), and
``decode_checked`` for settings the training process is started with.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, ClassVar, Mapping, TypeVar

R = TypeVar("R", bound="Record")


_PLAIN: frozenset[type] = frozenset({str, int, bool, type(None)})


def to_json(value: Any) -> Any:
    """Plain JSON types only: NaN and infinities become None, tuples lists, dataclasses dicts.

    Exact built-in types are tried first, by ``type()``: the training thread encodes several
    records a step, and ``isinstance(value, Mapping)`` (an ABC check) per value cost a 2.6 ms CUDA
    step about 0.7 ms."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): to_json(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [to_json(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


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
        return {name: to_json(getattr(self, name)) for name in _field_names(type(self))}

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


D = TypeVar("D")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _record_in(hint: Any) -> type | None:
    """The dataclass ``hint`` names, alone or as ``X | None``; None for any other type."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    found = [o for o in options if isinstance(o, type) and dataclasses.is_dataclass(o)]
    return found[0] if len(found) == 1 else None


def decode_checked(cls: type[D], data: Any, *, where: str) -> tuple[D, list[str]]:
    """The frozen dataclass ``cls`` built from decoded JSON ``data``, every value checked against
    its field's type: (the instance, the keys it does not know, for the caller to warn about).
    A list becomes a tuple where the field is one; an object becomes the nested dataclass its
    field names. ``ValueError`` names the first wrong field (``where.field: what is wrong``), and
    passes on the dataclass's own checks (``__post_init__``)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    names = _field_names(cls)
    unknown = sorted(str(k) for k in data if k not in names)
    values: dict[str, Any] = {}
    for name in names:
        if name not in data:
            continue
        value, hint = data[name], hints[name]
        problem = type_problem(value, hint)
        if problem is not None:
            raise ValueError(f"{where}.{name}: {problem}")
        nested = _record_in(hint)
        if nested is not None and isinstance(value, Mapping):
            value, inner = decode_checked(nested, value, where=f"{where}.{name}")
            unknown += [f"{name}.{key}" for key in inner]
        elif typing.get_origin(hint) is tuple:
            value = tuple(value)
        values[name] = value
    try:
        return cls(**values), unknown
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
