"""The bus-bandwidth sweep's cache: JSON under $ADVISOR_HOME (or ~/.cache/advisor).

Torch-free so the report can show measured peaks beside achieved bandwidth cheaply.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

CACHE_NAME = "comm_bench.json"


def cache_path() -> Path:
    """$ADVISOR_HOME/comm_bench.json, else ~/.cache/advisor/comm_bench.json."""
    home = os.environ.get("ADVISOR_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "advisor"
    return base / CACHE_NAME


def cache_key(*, backend: str, world_size: int, device: str, hostname: str) -> str:
    return f"{hostname}|{backend}|{device}|{world_size}"


def load_cache(path: Path | None = None) -> dict[str, Any]:
    """All cached sweeps by key; an unreadable or missing cache is empty, never an error."""
    path = path or cache_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_result(key: str, result: dict[str, Any], path: Path | None = None) -> Path:
    path = path or cache_path()
    data = load_cache(path)
    data[key] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    return path


def bench_busbw(cache: dict[str, Any], *, op: str, nbytes: int, world_size: int) -> float | None:
    """Measured bus bandwidth (bytes/s) for ``op`` at the swept size nearest ``nbytes`` (log scale)
    among cached sweeps on ``world_size`` ranks; None when nothing fits."""
    best: tuple[float, float] | None = None
    for entry in cache.values():
        if not isinstance(entry, dict) or entry.get("world_size") != world_size:
            continue
        for row in entry.get("results", []):
            if row.get("op") != op or not row.get("bytes") or row.get("busbw") is None:
                continue
            dist = abs(math.log(max(nbytes, 1)) - math.log(row["bytes"]))
            if best is None or dist < best[0]:
                best = (dist, float(row["busbw"]))
    return None if best is None else best[1]
