"""Run the advisor in a child process under an address-space cap, and measure what it took.

``resource.setrlimit(RLIMIT_AS)`` is what ``ulimit -v`` sets on HPC login nodes: past it an
allocation fails (MemoryError) instead of the kernel's OOM killer ending the process. The import
paths never load torch, so 1 GiB holds them with room (an ordinary import peaks near 40 MB).

The peak RSS is the child's own ``VmHWM``, written at its exit: ``ru_maxrss`` of a child started
from pytest counts the pytest process it was forked from (Linux keeps the high-water mark across
``exec``), 170 MB before the advisor had read a byte.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30

# python -c _RUN PEAK_FILE ARGS...: ``python -m advisor ARGS``, writing its peak RSS (kB) at exit.
_RUN = """import atexit, runpy, sys
peak_file = sys.argv.pop(1)
def peak():
    with open('/proc/self/status') as status:
        found = [line.split()[1] for line in status if line.startswith('VmHWM:')]
    with open(peak_file, 'w') as out:
        out.write(found[0] if found else '0')
atexit.register(peak)
sys.argv[0] = 'advisor'
runpy.run_module('advisor', run_name='__main__', alter_sys=True)
"""


@dataclass
class Capped:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    max_rss_bytes: int


def run_capped(args: list[str], *, cap: int = GiB, timeout: float = 60.0, env: dict | None = None,
               cwd: Path = ROOT) -> Capped:
    """``python -m advisor ARGS`` under an ``RLIMIT_AS`` of ``cap`` bytes; killed after ``timeout``."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    with open(os.devnull, "rb") as stdin, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.TemporaryDirectory() as scratch:
        peak = Path(scratch) / "peak"
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", _RUN, str(peak), *args], cwd=cwd, env=env, stdin=stdin,
                                stdout=out, stderr=err, preexec_fn=limit)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        return Capped(returncode=proc.returncode, stdout=out.read().decode(errors="replace"),
                      stderr=err.read().decode(errors="replace"), seconds=seconds,
                      max_rss_bytes=int(peak.read_text() or 0) * 1024 if peak.exists() else 0)


def one_line_refusal(result: Capped) -> str:
    """The refusal's error line, after checking it is one (with at most a hint) and no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines and lines[0].startswith("advisor: error: "), result.stderr[-3000:]
    assert len(lines) <= 2 and all(line.startswith(("advisor: error: ", "hint: ")) for line in lines), lines
    return lines[0]
