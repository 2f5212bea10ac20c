"""The bus-bandwidth sweep's cache (``advisor bench-comm``), an ``advisor.records.json_cache``.

Torch-free so the report can show measured peaks beside achieved bandwidth cheaply.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from advisor.records.json_cache import JsonCache

CACHE_NAME = "comm_bench.json"


def cache_path() -> Path:
    """$ADVISOR_HOME/comm_bench.json, else ~/.cache/advisor/comm_bench.json."""
    return JsonCache(CACHE_NAME).path


def cache_key(*, backend: str, world_size: int, device: str, hostname: str) -> str:
    return f"{hostname}|{backend}|{device}|{world_size}"


def load_cache(path: Path | None = None) -> dict[str, Any]:
    """All cached sweeps by key; an unreadable or missing cache is empty, never an error."""
    return JsonCache(CACHE_NAME, path=path).load()


def save_result(key: str, result: dict[str, Any], path: Path | None = None) -> Path | None:
    """The cache's path, or None when it could not be written."""
    return JsonCache(CACHE_NAME, path=path).put(key, result)


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
