"""The final report, made while the training process tears down.

A training process's last act, after its exit record, is its own teardown: freeing the model,
torch's exit handlers (0.6 s for a model of 5001 modules, bare or attached). The report (advice,
sections, JSON) took 0.7 s more, after it. Once every rank this controller hosts has sent an exit
record with code 0 and closed its channel, ``EarlyReport`` builds the report for the state as
``Session.finish`` will leave it should the process exit 0. ``take`` hands it over only when the
state's version shows that nothing but ``finish`` changed it since and the verdict is the one
predicted; otherwise the caller makes the report as before. A failing job is never predicted.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, NamedTuple

from advisor.advice import advise_state
from advisor.controller import Session, finished_fields
from advisor.records.samples import ExitInfo, Record
from advisor.report import build_report, json_text


class Made(NamedTuple):
    """A final report and what it was made from."""

    state: Any  # the state with its advice
    advice: tuple[Any, list[Any]] | None
    report: dict[str, Any]
    json: str | None  # the report as ``write_json`` writes it (made only when asked for)


def advised(state: Any, budget_bytes: int | None) -> tuple[Any, tuple[Any, list[Any]] | None]:
    """``state`` with its advice made from itself, and that advice (None when it failed) for the
    report to serialise rather than make again: a rank's last records can come in after the
    advice loop's last refresh (its readers wait 5 s at most, a loaded 2-rank job's took longer), and
    the report then read a diagnosis peak of 8.47 MB beside a memory section's 8.52 MB."""
    try:
        diagnosis, recs = advise_state(state, budget_bytes=budget_bytes)
    except Exception:  # noqa: BLE001 - the advice loop's last advice stands; the report says why
        return state, None
    advised_state = state if diagnosis is None else dataclasses.replace(state, diagnosis=diagnosis,
                                                                           recommendations=recs)
    return advised_state, (diagnosis, recs)


def make(state: Any, budget_bytes: int | None, *, with_json: bool) -> Made:
    state, advice = advised(state, budget_bytes)
    report = build_report(state, budget_bytes=budget_bytes, advice=advice)
    return Made(state, advice, report, json_text(report) if with_json else None)


class EarlyReport:
    """Builds the final report on a thread of its own once the job's ranks have all exited 0."""

    def __init__(self, session: Session, budget_bytes: int | None, *, with_json: bool) -> None:
        self._session = session
        self._budget = budget_bytes
        self._with_json = with_json
        self._thread: threading.Thread | None = None
        self._made: tuple[int, tuple[int, str], Made] | None = None  # (version, verdict, report)
        self._lock = threading.Lock()
        if not session.multinode:  # another node's ranks end on their own time
            session.add_listener(self._on_record)

    def _on_record(self, record: Record) -> None:
        if not isinstance(record, ExitInfo) or record.code != 0:
            return
        exits = self._session.live.snapshot().exits
        if any(rank not in exits or exits[rank].code != 0 for rank in self._session.expected_ranks()):
            return
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._build, name="advisor-early-report", daemon=True)
        self._thread.start()

    def _build(self) -> None:
        session = self._session
        try:
            session.server.wait_readers(timeout=5.0)  # the ranks' last records are in
            version, state = session.live.versioned_snapshot()
            verdict = session.verdict(state, 0)
            state = dataclasses.replace(state, **finished_fields(*verdict))
            self._made = (version, verdict, make(state, self._budget, with_json=self._with_json))
        except Exception:  # noqa: BLE001 - the report is then made after the process, as always
            self._made = None

    def take(self, code: int, reason: str) -> Made | None:
        """The report made early, if it is the one the state now gives; else None."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return None
        thread.join()
        made = self._made
        # finish() changes the state once (finished_fields): anything more (a warning, an
        # interrupted apply, the script's output) and the early report is out of date.
        if made is None or made[1] != (code, reason) or self._session.live.version != made[0] + 1:
            return None
        return made[2]
