"""The script's own output, followed from its file: the controller reads ``output.log`` as it grows.

Under the TUI the script writes to ``output.log`` in the session folder, never to a pipe of
ours, so a dead or stuck controller can never block or break its writes
(docs/architecture.md, Processes). The controller follows that file from a thread: each poll
reads what was appended since the last one and hands each complete line to a callback (the
``LiveState`` output buffer, which keeps the last lines only).

Memory stays bounded whatever the script prints: a poll reads at most ``MAX_BACKLOG`` bytes
(when more arrived since the last one, the older part is skipped and a line says how much),
and a line is cut at ``MAX_LINE`` characters (one that never ends is shown once it passes four
times that, and its rest is dropped). The file itself is never touched.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

OUTPUT_LOG = "output.log"  # in the session folder (advisor/controller.py writes the script's output there)
MAX_BACKLOG = 1 << 20  # bytes read by one poll; more than this since the last poll: the start is skipped
MAX_LINE = 4096  # characters kept of one line (a line without a newline is cut and shown at this length)
POLL_S = 0.1


def skipped_line(count: int, path: Path | str) -> str:
    """The line that stands for output not read (too much arrived at once); the file has it all."""
    return f"[advisor: {count} bytes of output not shown here; all of it is in {path}]"


def visible_line(raw: bytes) -> str:
    """One line as a terminal would leave it: text after the last carriage return (progress bars
    redraw a line with ``\\r``), decoded as UTF-8 with undecodable bytes replaced, at most
    ``MAX_LINE`` characters."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]  # a CRLF line ending
    if b"\r" in raw:
        raw = raw.rsplit(b"\r", 1)[1]
    return raw.decode("utf-8", errors="replace")[:MAX_LINE]


class OutputFollower:
    """Follows a file that another process appends to; ``on_line`` gets each complete line."""

    def __init__(self, path: Path | str, on_line: Callable[[str], None], *, interval: float = POLL_S,
                 max_backlog: int = MAX_BACKLOG) -> None:
        self.path = Path(path)
        self.on_line = on_line
        self.interval = interval
        self.max_backlog = max_backlog
        self.offset = 0  # bytes of the file consumed so far
        self.lines = 0  # complete lines handed on
        self._partial = b""  # the start of a line whose newline has not come yet
        self._cutting = False  # a line too long was shown cut: its rest is dropped up to its newline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # poll() from the thread and from stop() never interleave

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="advisor-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        """Stop following: read what is left, and hand on a last line that has no newline."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.poll()
        with self._lock:
            if self._partial:
                self._emit(self._partial)
                self._partial = b""

    def poll(self) -> int:
        """Read what was appended since the last poll; how many lines were handed on."""
        with self._lock:
            try:
                size = os.stat(self.path).st_size
            except OSError:
                return 0  # not created yet (or gone): nothing to follow
            if size < self.offset:  # truncated or replaced: start over
                self.offset, self._partial = 0, b""
            if size == self.offset:
                return 0
            start = self.offset
            if size - start > self.max_backlog:
                start = size - self.max_backlog
            try:
                with open(self.path, "rb") as handle:
                    handle.seek(start)
                    chunk = handle.read(size - start)
            except OSError:
                return 0
            handed = 0
            if start > self.offset:
                # Skipped to stay bounded: drop the cut line's tail, then say what is missing.
                cut = chunk.find(b"\n")
                chunk = chunk[cut + 1:] if cut >= 0 else b""
                missed = (size - len(chunk)) - self.offset + len(self._partial)
                self._partial, self._cutting = b"", False
                self._emit_text(skipped_line(missed, self.path))
                handed += 1
            self.offset = size
            pieces = chunk.split(b"\n")
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                if self._cutting:  # the rest of a line already shown cut: drop it up to its end
                    self._cutting = last
                    continue
                data = self._partial + piece
                if last:
                    self._partial = data
                else:
                    self._partial = b""
                    self._emit(data)
                    handed += 1
            if len(self._partial) > MAX_LINE * 4:  # no end in sight: show its start, drop the rest
                self._emit(self._partial)
                self._partial, self._cutting = b"", True
                handed += 1
            return handed

    def _emit(self, raw: bytes) -> None:
        self._emit_text(visible_line(raw))

    def _emit_text(self, line: str) -> None:
        self.lines += 1
        try:
            self.on_line(line)
        except Exception:  # the UI's buffer must never stop the recording
            pass


def read_tail(path: Path | str, *, max_bytes: int = MAX_BACKLOG) -> list[str]:
    """The last lines of a finished output file (``advisor open``), bounded like a live follow."""
    lines: list[str] = []
    follower = OutputFollower(path, lines.append, max_backlog=max_bytes)
    follower.stop()  # never started: one poll, then the last line without a newline
    return lines
