"""Headless live progress: one line per step (throttled), or a progress bar on a terminal."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from advisor.records import events
from advisor.records.events import SAID_BY_ADVICE, Oom, WarningEvent
from advisor.records.remedy import applied_name
from advisor.records.results import ApplyResult, ApplyStarted
from advisor.records.samples import Event, ExitInfo, Record, StepSample
from advisor.records.units import fmt_bytes, fmt_seconds, plain_text


def step_line(sample: StepSample) -> str:
    phases = sample.phases or {}
    total = sample.time_s or 1e-12
    share = " ".join(f"{key[:-2]} {100 * phases.get(key, 0.0) / total:3.0f}%"
                     for key in ("data_s", "forward_s", "backward_s", "optimizer_s"))
    loss = "n/a" if sample.loss is None else f"{sample.loss:.4f}"
    rank = f"rank {sample.rank} " if sample.rank else ""
    return f"{rank}step {sample.index:>5} | {fmt_seconds(sample.time_s):>8} | loss {loss} | {share}"


def _stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressPrinter:
    """Record listener printing progress to ``stream`` (stderr: the script owns stdout)."""

    def __init__(self, *, total: int | None, stream: TextIO = sys.stderr, min_interval: float = 0.25) -> None:
        self.stream = stream
        self.total = total
        self.min_interval = min_interval
        self._last = 0.0
        self._lock = threading.Lock()
        self._bar = None
        self._task = None
        # A live bar redraws its line in place: only where the script's output is not on the
        # same terminal, or the two would share lines.
        if stream.isatty() and not _stdout_is_terminal():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                 console=Console(file=stream), transient=True)
            self._task = self._bar.add_task("steps", total=total, info="")
            self._bar.start()

    def __call__(self, record: Record) -> None:
        with self._lock:
            if isinstance(record, StepSample):
                if record.rank != 0:
                    return
                if self._bar is not None:
                    self._bar.update(self._task, completed=record.index + 1,
                                     info=f"{fmt_seconds(record.time_s)}/step, loss "
                                          f"{'n/a' if record.loss is None else f'{record.loss:.4f}'}")
                    return
                now = time.monotonic()
                last_step = self.total is not None and record.index + 1 >= self.total
                if now - self._last >= self.min_interval or record.index < 3 or last_step:
                    self._last = now
                    print(f"advisor: {step_line(record)}", file=self.stream, flush=True)
            elif isinstance(record, Event) and record.name in (WarningEvent.NAME, Oom.NAME, ApplyResult.NAME,
                                                                ApplyStarted.NAME):
                self._print_event(record)
            elif isinstance(record, ExitInfo) and record.code != 0:
                print(plain_text(f"advisor: rank {record.rank} ended: {record.reason}"
                                 + (f" ({record.exc_type}: {record.message})" if record.exc_type else "")),
                      file=self.stream, flush=True)

    def _print_event(self, event: Event) -> None:
        payload = events.payload(event)
        if isinstance(payload, WarningEvent):
            if payload.source == SAID_BY_ADVICE:
                return  # the advice loop printed it when it decided (``AdviceLoop._say``)
            text = f"warning: {payload.message}"
        elif isinstance(payload, Oom):
            text = (f"out of memory in {payload.op or '?'} (module {payload.module or '?'}), "
                    f"requested {fmt_bytes(payload.requested_bytes)}")
        elif isinstance(payload, ApplyStarted):
            text = f"applied {applied_name(payload.remedy, payload.recommendation_id)} at step {payload.at_step if payload.at_step is not None else '?'}; measuring"
        elif isinstance(payload, ApplyResult):
            text = (f"{applied_name(payload.remedy, payload.recommendation_id)}: {payload.status}" + (f" ({payload.error})" if payload.error else "")
                    + (f" - {payload.reason}" if payload.reason else ""))
        else:
            return
        line = plain_text(f"advisor: {text}")  # the job's own words: no control sequence reaches the terminal
        if self._bar is not None:
            self._bar.console.print(line, markup=False)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
