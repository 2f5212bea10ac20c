"""``advisor import PATH... [--name N]``: classify the artifacts, import them, store a session, report it.

Everything is read and checked before the session folder is created, so a bad file leaves
nothing behind (and a failure after it is created removes it). A file the importer cannot take
(malformed, past a limit of ``limits``, more than memory allows) is one line and exit 3. The
records pass the controller's intake (``advisor.intake.admit``), as an agent's would: one that
fails is dropped and counted in a note. A trace and a snapshot of the same run can be imported
together: the snapshot's peak then joins the trace's last step on rank 0.
"""

from __future__ import annotations

import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from advisor.errors import EXIT_SESSION, AdvisorError, UsageError
from advisor.importers.jsonstream import StreamError
from advisor.importers.kineto import import_traces
from advisor.importers.limits import LimitError
from advisor.importers.result import ImportResult
from advisor.importers.safe_pickle import UnsafePickleError
from advisor.importers.snapshot import import_snapshot
from advisor.intake import RecordError, admit
from advisor.paths import DB_NAME, new_session_dir
from advisor.records.samples import Event, Record, StepSample
from advisor.render import print_report
from advisor.report import build_report, write_json
from advisor.state import LiveState
from advisor.store import SessionStore

TRACE_SUFFIXES = (".json", ".json.gz")
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")


def classify_file(path: Path) -> str | None:
    """"trace" (JSON or gzip), "snapshot" (pickle), or None for a file that is neither."""
    with open(path, "rb") as handle:
        head = handle.read(2)
    if head == b"\x1f\x8b" or head[:1] in (b"{", b" ", b"\n", b"\t", b"\r"):
        return "trace"
    if head[:1] == b"\x80" or head[:1] in (b"(", b"}", b"]"):  # protocol 2+ or an old text pickle
        return "snapshot"
    return None


def collect(paths: list[str]) -> tuple[list[Path], list[Path]]:
    """(trace files, snapshot files) named by ``paths``; folders contribute their artifacts."""
    traces: list[Path] = []
    snapshots: list[Path] = []
    for ref in paths:
        path = Path(ref)
        if not path.exists():
            raise UsageError(f"no such file or folder: {ref}", hint="pass Kineto traces (.json, .json.gz) or a "
                             "memory snapshot (.pickle)")
        if path.is_dir():
            found = sorted(p for p in path.iterdir()
                           if p.is_file() and p.name.endswith(TRACE_SUFFIXES + SNAPSHOT_SUFFIXES))
            if not found:
                raise UsageError(f"{ref} holds no trace (.json, .json.gz) or snapshot (.pickle) files")
        elif not path.is_file():  # a FIFO or a device: reading it would hang, or never end
            raise UsageError(f"{ref} is not a regular file", hint="pass Kineto traces (.json, .json.gz) or a "
                             "memory snapshot (.pickle)")
        else:
            found = [path]
        for file in found:
            kind = classify_file(file)
            if kind is None:
                raise UsageError(f"{file} is neither a Kineto trace (JSON) nor a memory snapshot (pickle)",
                                 hint="torch.profiler's export_chrome_trace and "
                                 "torch.cuda.memory._dump_snapshot write them")
            (traces if kind == "trace" else snapshots).append(file)
    return traces, snapshots


def _refused(message: str, hint: str | None = None) -> AdvisorError:
    return AdvisorError(message, hint=hint, exit_code=EXIT_SESSION)


# What a hostile or broken file can still raise from deep in an importer: a one-line refusal,
# never a traceback. MemoryError: a file past what this host (or its ulimit) can hold.
_UNREADABLE = (TypeError, ValueError, OverflowError, RecursionError, ArithmeticError, MemoryError)


def _why(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "it needs more memory than this process may use (ulimit -v, or the host's memory)"
    if isinstance(exc, (LimitError, StreamError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"[:300]


@contextmanager
def _refusing(what: str) -> Iterator[None]:
    """Whatever reading ``what`` raises, as one line (exit 3) with a hint where one helps."""
    try:
        yield
    except UnsafePickleError as exc:
        raise _refused(f"{what}: {exc}", hint="only load snapshots you trust in other tools too; "
                       "nothing in this file was run") from None
    except OSError as exc:
        raise _refused(f"cannot read {what}: {exc.strerror or exc}") from None
    except _UNREADABLE as exc:
        hint = ("is the file a complete Chrome trace from torch.profiler (export_chrome_trace)?"
                if isinstance(exc, StreamError) else None)
        raise _refused(f"cannot import {what}: {_why(exc)}", hint=hint) from None


def read_artifacts(traces: list[Path], snapshots: list[Path]) -> ImportResult:
    """All records of one session from the given files (raises AdvisorError with the file named)."""

    out = ImportResult()
    if traces:
        with _refusing("the trace" if len(traces) == 1 else "the traces"):
            found = import_traces(traces)
        out.records.extend(found.records)
        out.notes.extend(found.notes)
        out.summary["traces"] = found.summary
    last_step = max((r.index for r in out.records if isinstance(r, StepSample) and r.rank == 0), default=0)
    for path in snapshots:
        with _refusing(f"the snapshot {path}"):
            found = import_snapshot(path, step=last_step, with_run=not traces and path == snapshots[0])
        out.records.extend(found.records)
        out.notes.extend(n for n in found.notes if n not in out.notes)
        out.summary.setdefault("snapshots", []).append(found.summary)
    out.records, dropped = _admitted(out.records)
    if dropped:
        out.notes.append(dropped)
    return out


def _admitted(records: list[Record]) -> tuple[list[Record], str]:
    """The records that pass the controller's intake, and a note on those that do not."""
    kept: list[Record] = []
    count, last = 0, ""
    for record in records:
        try:
            kept.append(admit(record))
        except RecordError as exc:
            count += 1
            last = str(exc)
    note = f"{count} record(s) with impossible values were left out (last: {last})" if count else ""
    return kept, note


def run_import(paths: list[str], *, name: str | None, json_path: str | None) -> int:

    traces, snapshots = collect(paths)
    result = read_artifacts(traces, snapshots)
    label = name or (traces or snapshots)[0].name.split(".")[0]
    folder = new_session_dir(label)
    try:
        report = _store_session(folder, label, traces + snapshots, result)
    except BaseException as exc:  # a half-made session is worse than none: nothing is left behind
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(exc, _UNREADABLE):
            raise _refused(f"cannot import {len(traces + snapshots)} file(s): {_why(exc)}") from None
        raise
    if json_path:
        write_json(report, json_path)
        print(f"wrote report {json_path}", file=sys.stderr)
    else:
        print_report(report)
    print(f"advisor: imported {len(traces)} trace(s) and {len(snapshots)} snapshot(s) into session "
          f"{folder.name} ({folder})", file=sys.stderr)
    return 0


def _store_session(folder: Path, label: str, files: list[Path], result: ImportResult) -> dict:
    """Write the records into a new store in ``folder``; the session's report."""
    store = SessionStore(folder / DB_NAME)
    live = LiveState(session_id=folder.name, session_path=str(folder))
    try:
        store.set_meta(session_id=folder.name, script=label, argv=[], created=time.time(),
                       nproc_per_node=max(1, len({getattr(r, "rank", 0) for r in result.records})),
                       finished=True, exit_code=0, exit_reason="imported",
                       imported={"files": [str(p) for p in files], "notes": result.notes,
                                 "summary": result.summary})
        records = list(result.records)
        records += [Event(rank=0, name="warning", data={"message": note}) for note in result.notes]
        records.append(Event(rank=0, name="import", data={"files": [str(p) for p in files],
                                                            "missing": list(result.notes), **result.summary}))
        for record in records:
            store.put(record)
            live.add(record)
        live.update(finished=True, exit_code=0, exit_reason="imported")
        report = build_report(live.snapshot())
        store.set_meta(diagnosis=report.get("diagnosis"), recommendations=report.get("recommendations"))
    finally:
        store.close()
    if store.error:
        raise _refused(f"cannot write the session {folder.name}: {store.error}")
    return report
