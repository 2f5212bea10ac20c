"""A program on a pseudo-terminal of a given size, read back as the screen a person sees (pyte)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import termios
import time
from collections.abc import Sequence
from pathlib import Path

import pyte


class Terminal:
    """``argv`` in a child whose controlling terminal is a new ``columns`` x ``rows`` pty."""

    def __init__(self, argv: Sequence[str], *, columns: int, rows: int, cwd: Path, env: dict[str, str]) -> None:
        self.screen = pyte.Screen(columns, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""  # everything the program wrote, escape codes and all
        pid, master = pty.fork()
        if pid == 0:  # the child: the pty is its terminal
            os.chdir(cwd)
            os.environ.update(env)
            os.environ["TERM"] = "xterm-256color"
            os.execv(argv[0], list(argv))
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.pid, self.master = pid, master
        self.code: int | None = None

    def read(self, seconds: float) -> None:
        """Take what the program draws for a while (a pty's writer blocks when nobody reads)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    return
                self.raw += data
                self.stream.feed(data)

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def wait_for(self, pattern: str, timeout: float = 120.0) -> re.Match[str]:
        """Read until the screen shows ``pattern`` (a regular expression)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found
            self.read(0.1)
        raise AssertionError(f"never on screen: {pattern!r}; the screen:\n{self.text()}")

    def press(self, key: bytes) -> None:
        os.write(self.master, key)

    def wait_exit(self, timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.read(0.2)
                self.code = os.waitstatus_to_exitcode(status)
                return self.code
            self.read(0.1)
        raise AssertionError("the program did not exit")

    def close(self) -> None:
        if self.code is None:
            try:
                os.kill(self.pid, 9)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.master)

    def plain_since(self, offset: int) -> str:
        """What was written after byte ``offset``, escape codes removed (lines printed after the UI)."""
        return re.sub(r"\x1b(\[[0-9;?<>=]*[ -/]*[@-~]|\][^\x07]*\x07|[()][0-9A-Za-z]|[=>78])", "",
                      self.raw[offset:].decode(errors="replace"))
