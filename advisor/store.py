"""The session store: one SQLite file per session, every record written as it arrives.

WAL mode, so readers (``advisor report`` on a running session) never block the
writer. Records are stored as their JSON form with kind, rank and step columns
for querying; ``load_state`` replays them into a ``SessionState``, followed by the
spill files that agents wrote while the controller was gone. Read paths open the
file read-only and never rename, truncate or create anything.

A store that cannot write (a full disk, an I/O error) is never silent: the writer says so once
(``on_failure``, which the controller turns into a warning on the terminal and in the report),
frees a small reserve it made at the start so that the failure and, at the end, how the session
ended still fit in the metadata (``store_error``), and from then on appends records to
``spill-store.jsonl`` while the disk has room, counting the rest as lost. Nothing is queued
beyond ``MAX_QUEUED`` records, so the controller's memory stays bounded whatever the disk does.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import queue
import sqlite3
import stat
import threading
import time
import urllib.parse
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from advisor.errors import SessionError
from advisor.exits import decide_exit
from advisor.intake import RecordError, parse_record
from advisor.priority import lower_priority
from advisor.records.advice import Diagnosis, Recommendation
from advisor.records.samples import PHASES, Event, Record, RecordTable
from advisor.regime import interrupted_applies
from advisor.session_meta import check_meta
from advisor.state import MAX_LIVE_STEPS, LiveState, SessionState
from advisor.step_totals import StepTotals
from advisor.store_steps import SCHEMA as STEPS_SCHEMA
from advisor.store_steps import StepWriter, fold_steps, has_layout, sum_series

SCHEMA_VERSION = 1
RECEIVED_SEQ = "received_seq"  # meta key: {agent connection id: highest frame seq stored}
STORE_ERROR = "store_error"  # meta key: {"error", "since", "records_lost"} once a write failed

RESERVE_NAME = "store-reserve"  # freed when a write fails, so the end state still fits
RESERVE_BYTES = 256 << 10
STORE_SPILL = "spill-store.jsonl"  # the controller's own records once the store cannot write
MAX_QUEUED = 100_000  # records waiting for the writer; beyond, counted as lost (memory stays bounded)
MAX_SPILL_LINE = 16 << 20  # a longer line in a spill file is skipped (as the channel's frame limit)
# Per-record data errors (the record is dropped, the writer goes on); sqlite3.OperationalError
# (a full disk, an I/O error) is the store failing, handled once for all that follows.
_RECORD_ERRORS = (ValueError, TypeError, OverflowError, sqlite3.InterfaceError, sqlite3.DataError)

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
        conn.executescript(_SCHEMA + STEPS_SCHEMA)
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
    """Writer side (controller): ``put`` queues, a thread writes and commits.

    ``on_failure(error)`` is called once, from the writer thread, when the store stops being
    able to write (see the module docstring); ``error`` and ``lost`` say what happened since.
    """

    def __init__(self, path: Path, *, on_failure: Callable[[str], None] | None = None) -> None:
        self.path = path
        # A new file, owner-only before SQLite opens it; never an existing file taken over.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        self._conn = _connect(path)
        self._queue: queue.Queue = queue.Queue()
        self._steps = StepWriter()
        self._received: dict[str, int] = {}  # connection id -> highest frame seq stored (RECEIVED_SEQ)
        self.failed = 0
        self.last_failure = ""
        self.on_failure = on_failure
        self.error = ""  # the write failure the store is degraded by, "" while it writes
        self.lost = 0  # records that reached neither the store nor the spill file
        self._since = 0.0
        self._pending_meta: dict[str, Any] = {}  # metadata held back while degraded, written at close
        self._spill: IO[str] | None = None
        self._reserve = path.with_name(RESERVE_NAME)
        _make_reserve(self._reserve)
        self._thread = threading.Thread(target=self._write_loop, name="advisor-store", daemon=True)
        self._thread.start()

    def set_meta(self, **values: Any) -> None:
        self._queue.put(("meta", values))

    def put(self, record: Record, origin: tuple[str | None, int] | None = None) -> None:
        """Store ``record``; ``origin`` (connection id, frame seq) of an agent's record is committed
        with it, so spilled copies of what is stored are skipped when the session is read."""
        if self._queue.qsize() >= MAX_QUEUED:  # the writer is stuck: never grow without bound
            self.lost += 1
            return
        self._queue.put(("record", (record, origin)))

    def flush(self, *, checkpoint: bool = False, timeout: float = 60.0) -> bool:
        """Wait until everything put so far is committed (False if not within ``timeout``);
        ``checkpoint`` also moves the WAL into the file, so its size is the session's."""
        done = threading.Event()
        self._queue.put(("flush", (done, checkpoint)))
        return done.wait(timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)
        self._conn.close()
        _remove(self._reserve)

    def _write_loop(self) -> None:
        lower_priority()  # bulk writes: never ahead of the job's steps on a shared core
        while True:
            item = self._queue.get()
            batch = [item]
            while True:  # write whatever has arrived in one transaction
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            meta: dict[str, Any] = {}
            records = []
            flushes = []
            for entry in batch:
                if entry is None:
                    continue
                kind, payload = entry
                if kind == "meta":
                    meta.update(payload)
                elif kind == "flush":
                    flushes.append(payload)
                else:
                    records.append(payload)
            if self.error:
                self._degraded(records, meta)
            else:
                try:
                    self._commit(records, meta)
                except (sqlite3.Error, OSError, MemoryError) as exc:
                    self._fail(exc, records, meta)
            for done, checkpoint in flushes:
                if checkpoint and not self.error:
                    try:
                        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    except sqlite3.Error:
                        pass  # a reader holds the WAL: the size then includes it
                done.set()
            if stop:
                if self.error:
                    self._write_end_state()
                return

    def _commit(self, records: list[tuple[Record, Any]], meta: dict[str, Any]) -> None:
        received = dict(self._received)
        vouched = False
        with self._conn:
            if meta:
                self._conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                                       [(k, json.dumps(v)) for k, v in meta.items()])
            rows = []
            for record, origin in records:
                if origin is not None and origin[0] is not None:
                    received[origin[0]] = max(origin[1], received.get(origin[0], 0))
                    vouched = True
                try:
                    if record.KIND == "step":
                        _insert(self._conn, record, self._steps)
                    else:
                        rows.append(_row(record))
                except _RECORD_ERRORS as exc:
                    self._failed_record(exc)
            self._insert_rows(rows)
            self._steps.trim(self._conn)
            if vouched:  # in the same transaction as the records it vouches for
                self._conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                                   (RECEIVED_SEQ, json.dumps(received)))
        self._received = received  # only once committed: a rolled-back batch vouches for nothing

    def _insert_rows(self, rows: list[tuple[Any, ...]]) -> None:
        """The records' rows in one statement (a deep step's 60,000 at 5001 modules), or one by
        one when one of them cannot be stored, which is then left out."""
        if not rows:
            return
        if not self._conn.in_transaction:  # a savepoint outside one would commit on its own release
            self._conn.execute("BEGIN")
        self._conn.execute("SAVEPOINT record_rows")  # the rows before a failed one are undone with it
        try:
            self._conn.executemany(_INSERT_RECORD, rows)
            return
        except _RECORD_ERRORS:
            self._conn.execute("ROLLBACK TO record_rows")
        finally:
            self._conn.execute("RELEASE record_rows")
        for row in rows:
            try:
                self._conn.execute(_INSERT_RECORD, row)
            except _RECORD_ERRORS as exc:
                self._failed_record(exc)

    def _failed_record(self, exc: BaseException) -> None:
        self.failed += 1  # one unstorable record must not stop the writer
        self.last_failure = f"{type(exc).__name__}: {exc}"[:300]

    def _fail(self, exc: BaseException, records: list[tuple[Record, Any]], meta: dict[str, Any]) -> None:
        """The first failed write: free the reserve, record the failure, say it, degrade."""
        self.error = f"{type(exc).__name__}: {exc}"[:300]
        self._since = time.time()
        _remove(self._reserve)
        self._write_meta({STORE_ERROR: self._error_meta()})
        if self.on_failure is not None:
            try:
                self.on_failure(self.error)
            except Exception:  # noqa: BLE001 - the controller's callback must not stop the writer
                pass
        self._degraded(records, meta)

    def _degraded(self, records: list[tuple[Record, Any]], meta: dict[str, Any]) -> None:
        """Records to the spill file while the disk has room (more than the reserve, which the
        end state needs), else counted as lost; metadata held for the end."""
        self._pending_meta.update(meta)
        for record, _ in records:
            if not self._spill_record(record):
                self.lost += 1

    def _spill_record(self, record: Record) -> bool:
        try:
            if _free_bytes(self.path.parent) < 4 * RESERVE_BYTES:
                return False
            if self._spill is None:
                fd = os.open(self.path.with_name(STORE_SPILL), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                self._spill = os.fdopen(fd, "a", buffering=1)
            self._spill.write(json.dumps({"kind": record.KIND, "data": record.to_dict()}, allow_nan=False) + "\n")
            return True
        except (OSError, *_RECORD_ERRORS):
            return False

    def _write_end_state(self) -> None:
        """At close, degraded: how the session ended and what was lost, each in a transaction of
        its own (the reserve freed at the failure leaves room for them)."""
        if self._spill is not None:
            try:
                self._spill.close()
            except OSError:
                pass
        end = {k: self._pending_meta.pop(k) for k in ("finished", "exit_code", "exit_reason")
               if k in self._pending_meta}
        self._write_meta({**end, STORE_ERROR: self._error_meta()})
        for key, value in self._pending_meta.items():  # the saved advice last: the largest, the least needed
            self._write_meta({key: value})

    def _error_meta(self) -> dict[str, Any]:
        return {"error": self.error, "since": self._since, "records_lost": self.lost,
                "spill": STORE_SPILL if self._spill is not None else None}

    def _write_meta(self, values: dict[str, Any]) -> bool:
        try:
            with self._conn:
                self._conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                                       [(k, json.dumps(v)) for k, v in values.items()])
            return True
        except (sqlite3.Error, OSError, *_RECORD_ERRORS):
            return False


def _make_reserve(path: Path) -> None:
    """Set aside ``RESERVE_BYTES`` of the session's disk (allocated, not sparse)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return
    try:
        os.write(fd, bytes(RESERVE_BYTES))
    except OSError:  # no room even for it: the store fails at its first write, as it would anyway
        pass
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _free_bytes(folder: Path) -> int:
    try:
        info = os.statvfs(folder)
    except (OSError, AttributeError):
        return 1 << 62  # not knowable here: try, and count what fails
    return info.f_bavail * info.f_frsize


_INSERT_RECORD = "INSERT INTO records(received, kind, rank, step, data) VALUES (?, ?, ?, ?, ?)"


def _row(record: Record) -> tuple[Any, ...]:
    """A record's row in the records table (the old layout's steps too)."""
    data = record.to_dict()
    step = data.get("index") if record.KIND == "step" else data.get("step")
    return (time.time(), record.KIND, data.get("rank"), step, json.dumps(data))


def _insert(conn: sqlite3.Connection, record: Record, steps: StepWriter | None = None) -> None:
    """One record's row; a step goes to the step tables (``steps``; None: the old layout's row)."""
    if steps is not None and record.KIND == "step":
        steps.insert(conn, record)
        return
    conn.execute(_INSERT_RECORD, _row(record))


def spill_files(db_path: Path) -> list[Path]:
    """Records agents wrote while no controller listened (they may still be writing), then the
    controller's own once its store could not write (``STORE_SPILL``)."""
    found = sorted(db_path.parent.glob("spill-rank*.jsonl"))
    own = db_path.with_name(STORE_SPILL)
    return found + [own] if os.path.lexists(own) else found


class SpillError(OSError):
    """A spill file that is not a regular file (a FIFO would hang the reader, a device never end)."""


def _open_spill(spill: Path) -> IO[bytes]:
    """The spill file, opened without following a link or blocking on a FIFO; ``SpillError``
    unless it is a regular file."""
    fd = os.open(spill, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SpillError(f"{spill.name} is not a regular file; it was skipped")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _spilled(spill: Path, stored: dict[str, int] | None = None) -> Iterator[tuple[Any, Any]]:
    """(kind, data) of each complete line; a torn last line (a writer mid-line or killed) is skipped,
    and so is a frame the agent had sent that the store holds (its ``seq`` at or below ``stored``
    for its connection, advisor/agent/channel.py).

    Read in place, never renamed or truncated: an orphaned agent may still be appending,
    and whatever it appends is read by the next ``advisor report``. Read a line at a time, each
    at most ``MAX_SPILL_LINE`` bytes, so memory stays bounded whatever the file holds.
    Raises ``SpillError`` for a spill file that is not a regular file.
    """
    try:
        handle = _open_spill(spill)
    except SpillError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: a link could point anywhere (/dev/zero)
            raise SpillError(f"{spill.name} is a symbolic link; it was skipped") from None
        return
    with handle:
        while True:
            line = handle.readline(MAX_SPILL_LINE)
            if not line:
                return
            if not line.endswith(b"\n"):
                if len(line) >= MAX_SPILL_LINE:  # an overlong line: skip to its end
                    while line and not line.endswith(b"\n"):
                        line = handle.readline(MAX_SPILL_LINE)
                continue  # a torn last line
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


def _sum_steps(conn: sqlite3.Connection, rank: int, last_id: int) -> tuple[StepTotals, int]:
    """A session of the old layout (steps in ``records``): the summary figures of one rank's
    stored steps up to row ``last_id``, and how many rows there were.

    Only the fields the summary reads are checked (as ``advisor.intake`` would) and no
    record objects are built: a million steps take seconds, not most of a minute.
    """
    rows = conn.execute("SELECT data FROM records WHERE kind = 'step' AND rank = ? AND id <= ? ORDER BY id",
                        (rank, last_id))
    return fold_steps(_legacy_fields(text) for (text,) in rows)


_WRONG: tuple[Any, ...] = (None, None, None, None, *([None] * len(PHASES)))  # counted, never summed


def _legacy_fields(text: Any) -> tuple[Any, ...]:
    try:
        data = json.loads(text)
        deep, phases = data.get("deep", False), data.get("phases") or {}
        if type(deep) is not bool:
            return _WRONG
        return (data["index"], data["time_s"], data.get("loss"), deep, *(phases.get(k) or 0.0 for k in PHASES))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return _WRONG


def read_meta(db_path: Path) -> dict[str, Any]:
    """The session's metadata, each key a reader uses checked (``SessionError`` names the file)."""
    conn = _open_read(db_path)
    try:
        meta: dict[str, Any] = {}
        for key, value in conn.execute("SELECT key, value FROM meta"):
            try:
                meta[key] = json.loads(value)
            except (ValueError, TypeError, RecursionError):
                continue
        return check_meta(meta, db_path)
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
        self.skipped_files: list[str] = []  # spill files that are not regular files
        self.totals: dict[int, StepTotals] = {}

    def __iter__(self) -> Iterator[Record]:
        """Every record stored, a table's rows as the records they stand for (advisor/records/table.py)."""
        for record in self._stored():
            if isinstance(record, RecordTable):
                yield from record.records()
            else:
                yield record

    def _stored(self) -> Iterator[Record]:
        conn = _open_read(self.db_path)
        stored: dict[str, int] = {}
        try:
            stored = _received_seq(conn)
            if has_layout(conn):
                yield from self._read_layout(conn)
            else:
                yield from self._read_legacy(conn)
        except sqlite3.DatabaseError as exc:
            self.damaged = f"{self.db_path} is damaged ({exc}); records before the damage were read"
        finally:
            conn.close()
        for spill in spill_files(self.db_path):
            try:
                for kind, data in _spilled(spill, stored):
                    record = self._parse(kind, data, decoded=True)
                    if record is not None:
                        yield record
            except SpillError as exc:
                self.skipped_files.append(str(exc))

    def _read_layout(self, conn: sqlite3.Connection) -> Iterator[Record]:
        """Steps in their own tables (``advisor.store_steps``): the series summed where the full
        records were trimmed, then every other record, then the full step records kept. One read
        transaction: a live writer's trim between the queries would leave its steps neither summed
        nor listed."""
        if not conn.in_transaction:
            conn.execute("BEGIN")
        self.totals, bad = sum_series(conn)
        self._count_bad(bad, "step series row with wrong field types")
        rows = itertools.chain(conn.execute("SELECT kind, data FROM records ORDER BY id"),
                               conn.execute("SELECT 'step', data FROM step_records ORDER BY id"))
        for kind, data in rows:
            record = self._parse(kind, data)
            if record is not None:
                yield record

    def _read_legacy(self, conn: sqlite3.Connection) -> Iterator[Record]:
        """Steps among the other records (sessions written before ``advisor.store_steps``)."""
        cutoff = self._sum_old_steps(conn)
        skip_to = min(cutoff.values(), default=0)  # rows up to here that are steps were all summed
        for row_id, kind, rank, data in conn.execute(
                "SELECT id, kind, rank, data FROM records WHERE kind != 'step' OR id > ? ORDER BY id", (skip_to,)):
            if kind == "step" and row_id <= cutoff.get(rank, 0):
                continue  # summed above
            record = self._parse(kind, data)
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
            self.totals[rank], seen = _sum_steps(conn, rank, last_id)
            self._count_bad(seen - self.totals[rank].count, f"step record of rank {rank} with wrong field types")
        return cutoff

    def _count_bad(self, bad: int, problem: str) -> None:
        if bad > 0:
            self.dropped += bad
            self.last_problem = problem

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
    warnings.extend(reader.skipped_files)
    if isinstance(meta.get(STORE_ERROR), dict):
        warnings.append(store_error_warning(meta[STORE_ERROR]))
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
    else:
        return live.snapshot()
    for event in interrupted_applies(state):  # (the controller stores these itself at the end)
        live.add(event)
    return live.snapshot()


def store_error_warning(error: dict[str, Any]) -> str:
    """One line for a session whose store stopped writing (meta ``store_error``)."""
    lost = error.get("records_lost")
    since = error.get("since")
    when = time.strftime(" at %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) and since > 0 else ""
    spill = f"; later records are in {error['spill']}" if isinstance(error.get("spill"), str) else ""
    counted = f"; {lost} record(s) were lost" if isinstance(lost, int) and lost > 0 else ""
    return f"the session store could not be written{when} ({error.get('error')}){spill}{counted}: the session may be incomplete"
