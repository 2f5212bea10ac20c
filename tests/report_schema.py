"""The JSON report's schema as data: every key path with the JSON types found there.

``schema(report)`` walks a report (as ``json.loads`` gives it) and maps each path (``$.memory.peak_bytes``,
``$.recommendations[].params.modules[]``) to the sorted JSON type names seen at it. The report's field
names are a public contract (docs/report-schema.md): tests/test_report_schema.py compares this map
on recorded sessions with tests/data/report_schema.json, written before the typed core replaced the
dicts inside the controller. ``ADVISOR_UPDATE_SCHEMA=1`` rewrites the fixture (only for an addition).
"""

from __future__ import annotations

import json
from typing import Any

_TYPES = {dict: "object", list: "array", str: "string", bool: "bool", int: "int", float: "float",
          type(None): "null"}


def schema(report: Any) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {}
    _walk(json.loads(json.dumps(report, allow_nan=False, default=str)), "$", found)
    return {path: sorted(types) for path, types in sorted(found.items())}


def _walk(value: Any, path: str, found: dict[str, set[str]]) -> None:
    found.setdefault(path, set()).add(_TYPES[type(value)])
    if isinstance(value, dict):
        for key, item in value.items():
            _walk(item, f"{path}.{key}", found)
    elif isinstance(value, list):
        for item in value:
            _walk(item, f"{path}[]", found)
