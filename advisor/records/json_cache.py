"""The one small cache the advisor keeps of measured figures: a JSON object per file.

Device ceilings (``device_cache.json``), the host link (``hostlink_cache.json``) and the
bus-bandwidth sweep (``comm_bench.json``) are measured once per machine and reused. Each lives in
``$ADVISOR_HOME`` (else ``~/.cache/advisor``), is owner-only (the folder 0700, the file 0600: it
names the machine's devices and hosts), holds at most ``max_entries`` keys (the oldest written
go first, so a machine that sees many devices or torch versions does not grow it without end)
and is replaced atomically (a fresh ``mkstemp`` file renamed over it: a reader never sees half
a file, and two writers lose at most one entry). A missing, unreadable or damaged cache reads as
empty and a cache that cannot be written is skipped: both only cost a re-measurement.
Standard library only: the probes and the controller's report read it alike.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_MAX_ENTRIES = 64


def cache_dir() -> Path:
    """``$ADVISOR_HOME``, else ``~/.cache/advisor``."""
    home = os.environ.get("ADVISOR_HOME")
    return Path(home) if home else Path.home() / ".cache" / "advisor"


class JsonCache:
    """Keys to JSON values in one file of ``cache_dir()`` (or at ``path``)."""

    def __init__(self, name: str, *, path: Path | None = None, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.name = name
        self._path = path
        self.max_entries = max_entries

    @property
    def path(self) -> Path:
        """Where it lives now (``$ADVISOR_HOME`` is read at each use: tests and sessions set it)."""
        return self._path if self._path is not None else cache_dir() / self.name

    def load(self) -> dict[str, Any]:
        """Every entry; {} when the file is missing, unreadable or not a JSON object."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> Any:
        return self.load().get(key)

    def put(self, key: str, value: Any) -> Path | None:
        """Store ``value`` under ``key`` (re-reading the file first: another process may have
        written meanwhile); the file's path, or None when it could not be written."""
        data = self.load()
        data.pop(key, None)  # written last: the newest entry
        data[key] = value
        for old in list(data)[: max(0, len(data) - self.max_entries)]:
            del data[old]
        path = self.path
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mode 0600
            try:
                with os.fdopen(fd, "w") as handle:
                    json.dump(data, handle, indent=1)  # in insertion order: the oldest first
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            return None  # a read-only home only costs a re-measurement next time
        return path
