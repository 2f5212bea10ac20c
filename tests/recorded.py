"""Recorded sessions as test data: tests/data/<name>.jsonl.gz, one record a line.

Each file is a real ``advisor attach`` session exported from its SQLite store
(the command that recorded it is in tests/data/README.md). The first line is
``{"kind": "meta", "data": {...}}`` (session id, exit code and reason); every
other line is ``{"kind": KIND, "data": record.to_dict()}`` in arrival order.
The advice the session saved is left out: tests compute it afresh.

Regenerate one with ``python3 tests/recorded.py SESSION.sqlite tests/data/NAME.jsonl.gz``.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT))

from advisor.records.samples import Record, record_from_message  # noqa: E402
from advisor.state import LiveState, SessionState  # noqa: E402

META_KEYS = ("session_id", "script", "nproc_per_node", "finished", "exit_code", "exit_reason")


def read(name: str) -> tuple[dict, list[Record]]:
    """The meta and the records of ``tests/data/<name>.jsonl.gz``."""
    meta: dict = {}
    records: list[Record] = []
    with gzip.open(DATA / f"{name}.jsonl.gz", "rt") as handle:
        for line in handle:
            item = json.loads(line)
            if item["kind"] == "meta":
                meta = item["data"]
            else:
                records.append(record_from_message(item["kind"], item["data"]))
    return meta, records


def feed(live: LiveState, name: str) -> dict:
    """Add a recorded session's records to ``live`` in their order, as the receiver does; its meta."""
    meta, records = read(name)
    for record in records:
        live.add(record)
    return meta


def load_state(name: str) -> SessionState:
    """A recorded session as ``advisor.store.load_state`` gives it (finished, exit code set)."""
    live = LiveState(session_id=name, session_path=str(DATA))
    meta = feed(live, name)
    live.update(finished=bool(meta.get("finished")), exit_code=meta.get("exit_code"),
                exit_reason=meta.get("exit_reason", ""))
    return live.snapshot()


def export(db_path: Path, out: Path) -> int:
    """Write a stored session as gzip'd JSON lines (deterministic bytes); the record count."""
    from advisor.store import iter_records, read_meta

    meta = {k: v for k, v in read_meta(db_path).items() if k in META_KEYS}
    lines = [json.dumps({"kind": "meta", "data": meta}, sort_keys=True)]
    lines += [json.dumps({"kind": r.KIND, "data": r.to_dict()}, sort_keys=True) for r in iter_records(db_path)]
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as handle:
        handle.write(("\n".join(lines) + "\n").encode())
    out.write_bytes(buffer.getvalue())
    return len(lines) - 1



if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 tests/recorded.py SESSION.sqlite tests/data/NAME.jsonl.gz")
    print(f"{export(Path(sys.argv[1]), Path(sys.argv[2]))} records written to {sys.argv[2]}")


def write_session(name: str, home: Path) -> Path:
    """Store a recorded session under ``home``/sessions as ``advisor attach`` would; its database path."""
    from advisor.paths import DB_NAME
    from advisor.store import SessionStore

    meta, records = read(name)
    folder = home / "sessions" / meta["session_id"]
    folder.mkdir(parents=True, mode=0o700)
    store = SessionStore(folder / DB_NAME)
    store.set_meta(**meta)
    for record in records:
        store.put(record)
    store.close()
    return folder / DB_NAME
