"""The session store: one SQLite file per session, every record written as it arrives.

WAL mode, so readers (``advisor report`` on a running session) never block the
writer. Records are stored as their JSON form with kind, rank and step columns
for querying; ``load_state`` replays them into a ``SessionState``. Spill files
that agents wrote while the controller was gone are merged on open.
"""

from __future__ import annotations

import json
import os
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from advisor.errors import SessionError
from advisor.state import LiveState, SessionState
from advisor.records.samples import Record, record_from_message

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    received REAL NOT NULL,
    kind TEXT NOT NULL,
    rank INTEGER,
    step INTEGER,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_kind ON records(kind, rank, step);
"""


def _connect(path: Path, *, create: bool) -> sqlite3.Connection:
    if not create and not path.is_file():
        raise SessionError(f"session file {path} does not exist")
    try:
        conn = sqlite3.connect(str(path), check_same_thread=False, timeout=10)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        if create:
            conn.executescript(_SCHEMA)
        else:
            conn.execute("SELECT count(*) FROM records").fetchone()
    except sqlite3.DatabaseError as exc:
        raise SessionError(
            f"{path} is not a readable advisor session ({exc})",
            hint="the file may be corrupted or not a session; `advisor sessions` lists valid ones",
        ) from None
    return conn


class SessionStore:
    """Writer side (controller): ``put`` queues, a thread writes and commits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # owner-only before SQLite opens it
        os.close(fd)
        self._conn = _connect(path, create=True)
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._write_loop, name="advisor-store", daemon=True)
        self._thread.start()

    def set_meta(self, **values: Any) -> None:
        self._queue.put(("meta", values))

    def put(self, record: Record) -> None:
        self._queue.put(("record", record))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)
        self._conn.close()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            while True:  # write whatever has arrived in one transaction
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            with self._conn:
                for entry in batch:
                    if entry is None:
                        continue
                    kind, payload = entry
                    if kind == "meta":
                        self._conn.executemany(
                            "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                            [(k, json.dumps(v)) for k, v in payload.items()],
                        )
                    else:
                        _insert(self._conn, payload)
            if stop:
                return


def _insert(conn: sqlite3.Connection, record: Record) -> None:
    data = record.to_dict()
    step = data.get("index") if record.KIND == "step" else data.get("step")
    conn.execute(
        "INSERT INTO records(received, kind, rank, step, data) VALUES (?, ?, ?, ?, ?)",
        (time.time(), record.KIND, data.get("rank"), step, json.dumps(data)),
    )


def merge_spills(db_path: Path) -> int:
    """Import agents' spill files (records written while no controller listened); returns the count."""
    folder = db_path.parent
    spills = sorted(folder.glob("spill-rank*.jsonl"))
    if not spills:
        return 0
    conn = _connect(db_path, create=False)
    merged = 0
    try:
        with conn:
            for spill in spills:
                for line in spill.read_text().splitlines():
                    try:
                        message = json.loads(line)
                        _insert(conn, record_from_message(message["kind"], message["data"]))
                        merged += 1
                    except (ValueError, KeyError, TypeError):
                        continue  # a torn last line from a killed process
                spill.rename(spill.with_suffix(".merged"))
    finally:
        conn.close()
    return merged


def read_meta(db_path: Path) -> dict[str, Any]:
    conn = _connect(db_path, create=False)
    try:
        return {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    finally:
        conn.close()


def iter_records(db_path: Path) -> Iterator[Record]:
    conn = _connect(db_path, create=False)
    try:
        for kind, data in conn.execute("SELECT kind, data FROM records ORDER BY id"):
            try:
                yield record_from_message(kind, json.loads(data))
            except (ValueError, TypeError):
                continue
    except sqlite3.DatabaseError as exc:
        raise SessionError(f"{db_path} is damaged ({exc})", hint="records before the damage were read") from None
    finally:
        conn.close()


def load_state(db_path: Path) -> SessionState:
    """Replay a stored session into a ``SessionState`` (merging spill files first)."""
    try:
        merge_spills(db_path)
    except (OSError, SessionError):
        pass  # a read-only copy of a session can still be reported
    meta = read_meta(db_path)
    live = LiveState(session_id=meta.get("session_id", db_path.parent.name), session_path=str(db_path.parent))
    for record in iter_records(db_path):
        live.add(record)
    extra = {k: meta[k] for k in ("diagnosis", "recommendations", "exit_code", "exit_reason") if k in meta}
    if extra:
        live.update(**extra)
    live.update(finished=bool(meta.get("finished", False)))
    return live.snapshot()
