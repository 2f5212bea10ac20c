"""The one JSON helper of the records: plain JSON types out, checked types in.

Every record family (samples.py, advice.py, results.py, commands.py, events.py) serialises
through ``to_json``. Records that cross a boundary inside the advisor (recommendations, commands,
apply results, event payloads) rebuild through ``decode``, which checks every field against its
type hint, nested records included, and raises ``ValueError`` naming the path of the first wrong
value; keys a newer sender added are ignored. The measurement records rebuild through
``Record.from_dict`` (the controller checks them once at its edge, ``advisor/intake.py``).
NaN handling and forward compatibility are decided here, once.
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


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(cls: type[T], data: Any, *, where: str = "") -> T:
    """The dataclass ``cls`` built from JSON ``data``, every field checked against its type hint.

    Missing fields take their defaults (a required one missing is an error); unknown keys are
    ignored; a null where a plain ``float`` belongs is NaN (``to_json`` writes NaN and infinities
    as null); a field typed as a record is decoded the same way (through its own ``from_dict``
    when it defines one: a record whose JSON shape is not its fields). ``ValueError`` names the
    path of the first wrong value, ``where`` first."""
    where = where or cls.__name__
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}.{f.name}: missing")
            continue
        values[f.name] = _value(hints[f.name], data[f.name], f"{where}.{f.name}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _value(hint: Any, value: Any, where: str) -> Any:
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
                return _value(option, value, where)
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
        return decode(hint, value, where=where)
    raise ValueError(f"{where}: no JSON form for {hint!r}")


class Checked(Record):
    """Mixin for records decoded with their types checked (``decode``): what crosses a boundary
    inside the advisor (commands, apply outcomes, event payloads)."""

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        return decode(cls, data)
