"""The session store: one SQLite file per session, every record written as it arrives.

WAL mode, so readers (``advisor report`` on a running session) never block the
writer. Records are stored as their JSON form with kind, rank and step columns
for querying; ``load_state`` replays them into a ``SessionState``, followed by the
spill files that agents wrote while the controller was gone. Read paths open the
file read-only and never rename, truncate or create anything.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import queue
import sqlite3
import threading
import time
import urllib.parse
from array import array
from pathlib import Path
from typing import Any, Iterator

from advisor.errors import SessionError
from advisor.exits import decide_exit
from advisor.intake import RecordError, parse_record
from advisor.records.advice import Diagnosis, Recommendation
from advisor.records.samples import PHASES, Event, Record
from advisor.state import MAX_LIVE_STEPS, LiveState, SessionState
from advisor.step_totals import StepTotals

SCHEMA_VERSION = 1
RECEIVED_SEQ = "received_seq"  # meta key: {agent connection id: highest frame seq stored}

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


def _connect(path: Path) -> sqlite3.Connection:
    """The writer's connection (the controller's own, new file), in WAL mode."""
    try:
        conn = sqlite3.connect(str(path), check_same_thread=False, timeout=10)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_SCHEMA)
    except sqlite3.DatabaseError as exc:
        raise SessionError(f"cannot create the session store {path} ({exc})") from None
    return conn


def _open_read(path: Path) -> sqlite3.Connection:
    """A read-only connection that never changes the file or creates one beside it.

    With no ``-wal`` file beside it, no writer is connected and every commit is in
    the file itself: ``immutable=1`` reads it without locks, a WAL index or any
    file of its own, so a finished session, a copy or a read-only mount reads as
    it is. With a ``-wal`` file (a live controller, or one that was killed),
    ``mode=ro`` reads through it, so commits still in the WAL are seen.
    """
    if not path.is_file():
        raise SessionError(f"session file {path} does not exist")
    uri = "file:" + urllib.parse.quote(str(path.resolve()))
    wal = path.with_name(path.name + "-wal").exists()
    last: Exception | None = None
    for flags in (("mode=ro", "mode=ro&immutable=1") if wal else ("mode=ro&immutable=1",)):
        try:
            conn = sqlite3.connect(f"{uri}?{flags}", uri=True, check_same_thread=False, timeout=10)
        except sqlite3.DatabaseError as exc:
            last = exc
            continue
        try:
            conn.execute("SELECT count(*) FROM records").fetchone()
            conn.execute("SELECT count(*) FROM meta").fetchone()
            return conn
        except sqlite3.DatabaseError as exc:
            conn.close()
            last = exc
    raise SessionError(
        f"{path} is not a readable advisor session ({last})",
        hint="the file may be corrupted or not a session; `advisor sessions` lists valid ones",
    )


class SessionStore:
    """Writer side (controller): ``put`` queues, a thread writes and commits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # A new file, owner-only before SQLite opens it; never an existing file taken over.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        self._conn = _connect(path)
        self._queue: queue.Queue = queue.Queue()
        self._received: dict[str, int] = {}  # connection id -> highest frame seq stored (RECEIVED_SEQ)
        self.failed = 0
        self.last_failure = ""
        self._thread = threading.Thread(target=self._write_loop, name="advisor-store", daemon=True)
        self._thread.start()

    def set_meta(self, **values: Any) -> None:
        self._queue.put(("meta", values))

    def put(self, record: Record, origin: tuple[str | None, int] | None = None) -> None:
        """Store ``record``; ``origin`` (connection id, frame seq) of an agent's record is committed
        with it, so spilled copies of what is stored are skipped when the session is read."""
        self._queue.put(("record", (record, origin)))

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
                received = False
                for entry in batch:
                    if entry is None:
                        continue
                    kind, payload = entry
                    if kind == "meta":
                        self._conn.executemany(
                            "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                            [(k, json.dumps(v)) for k, v in payload.items()],
                        )
                        continue
                    record, origin = payload
                    if origin is not None and origin[0] is not None:
                        self._received[origin[0]] = max(origin[1], self._received.get(origin[0], 0))
                        received = True
                    try:
                        _insert(self._conn, record)
                    except (ValueError, TypeError, OverflowError, sqlite3.Error) as exc:
                        self.failed += 1  # one unstorable record must not stop the writer
                        self.last_failure = f"{type(exc).__name__}: {exc}"[:300]
                if received:  # in the same transaction as the records it vouches for
                    self._conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                                       (RECEIVED_SEQ, json.dumps(self._received)))
            if stop:
                return


def _insert(conn: sqlite3.Connection, record: Record) -> None:
    data = record.to_dict()
    step = data.get("index") if record.KIND == "step" else data.get("step")
    conn.execute(
        "INSERT INTO records(received, kind, rank, step, data) VALUES (?, ?, ?, ?, ?)",
        (time.time(), record.KIND, data.get("rank"), step, json.dumps(data)),
    )


def spill_files(db_path: Path) -> list[Path]:
    """Records agents wrote while no controller listened (they may still be writing)."""
    return sorted(db_path.parent.glob("spill-rank*.jsonl"))


def _spilled(spill: Path, stored: dict[str, int] | None = None) -> Iterator[tuple[Any, Any]]:
    """(kind, data) of each complete line; a torn last line (a writer mid-line or killed) is skipped,
    and so is a frame the agent had sent that the store holds (its ``seq`` at or below ``stored``
    for its connection, advisor/agent/channel.py).

    Read in place, never renamed or truncated: an orphaned agent may still be appending,
    and whatever it appends is read by the next ``advisor report``.
    """
    try:
        with open(spill, "rb") as handle:
            content = handle.read()
    except OSError:
        return
    for line in content.split(b"\n"):
        try:
            message = json.loads(line)
            conn, seq = message.get("conn"), message.get("seq")
            if stored and isinstance(conn, str) and isinstance(seq, int) and seq <= stored.get(conn, 0):
                continue
            yield message.get("kind"), message.get("data")
        except (ValueError, AttributeError, RecursionError):
            continue


def _received_seq(conn: sqlite3.Connection) -> dict[str, int]:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (RECEIVED_SEQ,)).fetchone()
    try:
        value = json.loads(row[0]) if row else {}
    except (ValueError, TypeError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)}


_NUMBER = (int, float)


def _sum_steps(conn: sqlite3.Connection, rank: int, last_id: int) -> StepTotals:
    """The summary figures of one rank's stored steps up to row ``last_id``.

    Only the fields the summary reads are checked (as ``advisor.intake`` would) and no
    record objects are built: a million steps take seconds, not most of a minute.
    """
    times: dict[str, array] = {"steady": array("d"), "deep": array("d"), "warmup": array("d")}
    sums: dict[str, list[float]] = {c: [0.0] * len(PHASES) for c in times}
    last: tuple[int, Any] | None = None
    loads = json.loads
    rows = conn.execute("SELECT data FROM records WHERE kind = 'step' AND rank = ? AND id <= ? ORDER BY id",
                        (rank, last_id))
    for (text,) in rows:
        try:
            data = loads(text)
            index, time_s, deep, loss = data["index"], data["time_s"], data.get("deep", False), data.get("loss")
            phases = data.get("phases") or {}
            values = [phases.get(k) or 0.0 for k in PHASES]
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            continue
        if (type(index) is not int or index < 0 or type(time_s) not in _NUMBER or not 0 <= time_s < math.inf
                or type(deep) is not bool or (loss is not None and type(loss) not in _NUMBER)
                or any(type(v) not in _NUMBER or not math.isfinite(v) for v in values)):
            continue
        category = "warmup" if index == 0 else "deep" if deep else "steady"
        times[category].append(time_s)
        row = sums[category]
        for k, v in enumerate(values):
            row[k] += v
        last = (index, loss)
    totals = StepTotals()
    for category, values in times.items():
        totals.add_many(category, values, dict(zip(PHASES, sums[category])))
    if last is not None:
        totals.set_last(*last)
    return totals


def read_meta(db_path: Path) -> dict[str, Any]:
    conn = _open_read(db_path)
    try:
        meta: dict[str, Any] = {}
        for key, value in conn.execute("SELECT key, value FROM meta"):
            try:
                meta[key] = json.loads(value)
            except (ValueError, RecursionError):
                continue
        return meta
    except sqlite3.DatabaseError as exc:
        raise SessionError(f"{db_path} is damaged ({exc})") from None
    finally:
        conn.close()


class RecordReader:
    """Iterates a session's records (store, then spill files); counts and names the bad ones.

    Steps older than the last ``MAX_LIVE_STEPS`` of their rank are not built into records:
    ``totals`` sums them (read with SQLite's JSON functions, a few columns a row), so a
    million-step session loads in seconds and the summary still covers every step.
    """

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.dropped = 0
        self.last_problem = ""
        self.damaged = ""
        self.totals: dict[int, StepTotals] = {}

    def __iter__(self) -> Iterator[Record]:
        conn = _open_read(self.db_path)
        stored: dict[str, int] = {}
        try:
            stored = _received_seq(conn)
            cutoff = self._sum_old_steps(conn)
            skip_to = min(cutoff.values(), default=0)  # rows up to here that are steps were all summed
            for row_id, kind, rank, data in conn.execute(
                    "SELECT id, kind, rank, data FROM records WHERE kind != 'step' OR id > ? ORDER BY id", (skip_to,)):
                if kind == "step" and row_id <= cutoff.get(rank, 0):
                    continue  # summed above
                record = self._parse(kind, data)
                if record is not None:
                    yield record
        except sqlite3.DatabaseError as exc:
            self.damaged = f"{self.db_path} is damaged ({exc}); records before the damage were read"
        finally:
            conn.close()
        for spill in spill_files(self.db_path):
            for kind, data in _spilled(spill, stored):
                record = self._parse(kind, data, decoded=True)
                if record is not None:
                    yield record

    def _sum_old_steps(self, conn: sqlite3.Connection) -> dict[Any, int]:
        """Fold each rank's older steps into ``totals``; returns rank -> the last row id summed."""
        cutoff: dict[Any, int] = {}
        ranks = conn.execute("SELECT rank, count(*) FROM records WHERE kind = 'step' GROUP BY rank").fetchall()
        for rank, count in ranks:
            if count <= MAX_LIVE_STEPS or not isinstance(rank, int):
                continue
            (last_id,) = conn.execute("SELECT id FROM records WHERE kind = 'step' AND rank = ? ORDER BY id DESC "
                                      "LIMIT 1 OFFSET ?", (rank, MAX_LIVE_STEPS)).fetchone()
            cutoff[rank] = last_id
            self.totals[rank] = _sum_steps(conn, rank, last_id)
            valid = self.totals[rank].count
            if valid < count - MAX_LIVE_STEPS:
                self.dropped += count - MAX_LIVE_STEPS - valid
                self.last_problem = f"step record of rank {rank} with wrong field types"
        return cutoff

    def _parse(self, kind: Any, data: Any, *, decoded: bool = False) -> Record | None:
        try:
            return parse_record(kind, data if decoded else json.loads(data))
        except (RecordError, ValueError, TypeError, RecursionError) as exc:
            self.dropped += 1
            self.last_problem = str(exc)[:300]
            return None


def iter_records(db_path: Path) -> Iterator[Record]:
    yield from RecordReader(db_path)


def _ranks_expected(meta: dict[str, Any], state: SessionState) -> int:
    """How many ranks' exits finish the session: those this node hosted in a multi-node job."""
    job = meta.get("job") if isinstance(meta.get("job"), dict) else {}
    if job.get("launcher") in ("torchrun", "env") and job.get("ranks_hosted"):
        return len(job["ranks_hosted"])
    return max(int(meta.get("nproc_per_node") or 1), state.world_size)


def saved_advice(meta: dict[str, Any]) -> dict[str, Any]:
    """The advice the controller saved at the end of the session (``Session.save_analysis``), as
    typed records; {} when there is none or it does not decode (another version's shape): the
    readers then advise afresh from the records, the one path (``advisor.advice.advise_state``)."""
    try:
        out: dict[str, Any] = {}
        if isinstance(meta.get("diagnosis"), dict):
            out["diagnosis"] = Diagnosis.from_dict(meta["diagnosis"])
        if isinstance(meta.get("recommendations"), list):
            out["recommendations"] = [Recommendation.from_dict(r) for r in meta["recommendations"]]
        return out
    except (ValueError, TypeError):
        return {}


def load_state(db_path: Path) -> SessionState:
    """Replay a stored session (and any spill files) into a ``SessionState``; reads, never writes."""
    meta = read_meta(db_path)
    live = LiveState(session_id=str(meta.get("session_id", db_path.parent.name)), session_path=str(db_path.parent))
    reader = RecordReader(db_path)
    records = iter(reader)
    first = next(records, None)  # reading starts: the old steps are summed into reader.totals
    if reader.totals:
        live.update(step_totals=dict(reader.totals))
    for record in itertools.chain([first] if first is not None else [], records):
        try:
            live.add(record)
        except Exception as exc:  # noqa: BLE001 - one record must never cost the session
            reader.dropped += 1
            reader.last_problem = f"{type(exc).__name__}: {exc}"[:300]
    warnings = []
    if reader.dropped:
        warnings.append(f"{reader.dropped} malformed record(s) dropped while loading (last: {reader.last_problem})")
    if reader.damaged:
        warnings.append(reader.damaged)
    for message in warnings:
        live.add(Event(name="warning", data={"message": message}))
    extra = saved_advice(meta)
    if isinstance(meta.get("job"), dict):  # a multi-node job's id and the ranks this node hosted
        extra["job"] = meta["job"]
    if extra:
        live.update(**extra)
    state = live.snapshot()
    if meta.get("finished"):
        code = meta.get("exit_code")
        live.update(finished=True, exit_code=code if isinstance(code, int) else None,
                    exit_reason=str(meta.get("exit_reason", "")))
    elif state.exits and len(state.exits) >= _ranks_expected(meta, state):
        # The controller died, but every rank reported its exit (through a spill file): finished.
        code, reason = decide_exit(state, None, len(state.exits))
        live.update(finished=True, exit_code=code, exit_reason=f"{reason} (recovered: the controller had stopped)")
    return live.snapshot()
