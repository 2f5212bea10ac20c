"""How a job ended: which rank failed first, with its own code, and what followed from it.

When one rank of a multi-rank job fails, the launcher (torchrun) stops the others
with SIGTERM and they report "terminated by SIGTERM"; a rank that dies by
``os._exit`` or a signal reports nothing at all. So the first failure is taken,
in this order, from the launcher's own record of which worker failed first (see
``LAUNCHER_CODE``: the failures torchrun's ``ChildFailedError`` carries, written
to ``launcher-exits.json``), then from the agents' exit records in the order they
arrived, with SIGTERM exits counted as consequences, never as causes, except after a stop
the user asked for (then a rank ended by the stop is the cause).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from advisor.records.samples import ExitInfo
from advisor.state import SessionState

LAUNCHER_EXITS = "launcher-exits.json"
_SIGTERM_CODE = 128 + signal.SIGTERM
_STOP_CODES = (128 + signal.SIGINT, _SIGTERM_CODE)  # a rank that ended by a stop (Ctrl-C, SIGTERM)

# Run as torchrun's own process (``python -c LAUNCHER_CODE --standalone ...``): the
# launcher as ``python -m torch.distributed.run`` would run it, plus one file saying
# which worker failed first and how, from the ChildFailedError torchrun raises, or, on
# a node of a multi-node job, that the launcher itself lost the job's rendezvous (the
# store lives on another node: when that node's launcher exits, this one fails with
# RendezvousConnectionError and SIGTERMs its workers, which then only know "SIGTERM").
LAUNCHER_CODE = """\
import json, os, sys
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousError
from torch.distributed.run import main
def write(out):
    path = os.environ.get("ADVISOR_LAUNCHER_EXITS")
    if path:
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(out, handle)
        os.replace(path + ".tmp", path)
try:
    main()
except ChildFailedError as exc:
    write({str(rank): {"exitcode": f.exitcode, "timestamp": f.timestamp, "local_rank": f.local_rank,
                       "pid": f.pid, "signal": f.signal_name() if f.exitcode < 0 else None}
           for rank, f in exc.failures.items()})
    raise
except RendezvousError as exc:
    write({"rendezvous": {"error": type(exc).__name__, "message": str(exc)[:500]}})
    raise
"""


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def read_launcher_exits(session_dir: Path) -> dict[int, dict[str, Any]]:
    """rank -> {"exitcode", "timestamp", ...} from the launcher's file; {} when absent or unreadable."""
    try:
        raw = json.loads((session_dir / LAUNCHER_EXITS).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    out: dict[int, dict[str, Any]] = {}
    if isinstance(raw, dict):
        for rank, info in raw.items():
            if (isinstance(info, dict) and str(rank).isdigit() and isinstance(info.get("exitcode"), int)
                    and not isinstance(info.get("exitcode"), bool)):
                out[int(rank)] = info
    return out


def read_rendezvous_failure(session_dir: Path) -> str | None:
    """The error type with which this node's launcher lost the job's rendezvous, or None."""
    try:
        raw = json.loads((session_dir / LAUNCHER_EXITS).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    failure = raw.get("rendezvous") if isinstance(raw, dict) else None
    error = failure.get("error") if isinstance(failure, dict) else None
    return error if isinstance(error, str) and error.isidentifier() else None


_RENDEZVOUS_REASONS = {
    "RendezvousTimeoutError": "timed out waiting for the job's other nodes to join (check that every node "
                              "runs with the same --rdzv-endpoint and --rdzv-id, and can reach it)",
    "RendezvousConnectionError": "lost contact with the job's store: the node hosting it is gone, or its "
                                 "launcher stopped after a rank there failed",
    "RendezvousClosedError": "found it closed by another node's launcher (a rank there failed, or it was stopped)",
}


def rendezvous_lost_reason(error: str) -> str:
    """One line on why this node's launcher left the rendezvous, by the error type it raised."""
    what = _RENDEZVOUS_REASONS.get(error, "failed in it")
    return f"this node's launcher left the job's rendezvous ({error}): it {what}"


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _code_of(exitcode: int) -> int:
    """A process exit status as a shell shows it: 128+N for death by signal N."""
    return 128 - exitcode if exitcode < 0 else exitcode


def _describe(info: ExitInfo) -> str:
    if info.exc_type:
        frame = info.frame or {}
        at = f" at {frame.get('file')}:{frame.get('line')} in {frame.get('function')}" if frame else ""
        return f"{info.exc_type}: {info.message}{at}"
    return info.reason or f"exit code {info.code}"


def _consequences(exits: list[ExitInfo], culprit: int) -> str:
    """The other ranks' failures, shown as what they are: a consequence of the first one."""
    others = [e for e in exits if e.rank != culprit and e.code != 0]
    if not others:
        return ""
    parts = []
    for e in sorted(others, key=lambda e: e.rank):
        how = "stopped by SIGTERM" if e.code == _SIGTERM_CODE else (e.exc_type or f"exit code {e.code}")
        parts.append(f"rank {e.rank} {how}")
    return f"; then, as a consequence: {', '.join(parts)}"


def decide_exit(state: SessionState, returncode: int | None, nproc: int,
                launcher: dict[int, dict[str, Any]] | None = None,
                ranks: list[int] | None = None, before_stop: frozenset[int] | None = None) -> tuple[int, str]:
    """The job's exit code and a one-line reason.

    ``returncode`` is the launched process's own status (None when unknown: a session
    recovered after the controller died); ``launcher`` is ``read_launcher_exits``;
    ``ranks`` the global ranks this controller hosts (default ``0 .. nproc-1``; a node of a
    multi-node job hosts others); ``before_stop`` the ranks whose exit had come when the user stopped
    the job (the TUI's stop, a signal to attach, Ctrl-C; None: nobody did). After a stop, a rank ended by it is the cause and a
    rank's exception after it a consequence: its collective lost the peer the stop ended first
    (gloo's "Connection closed by peer" made a stopped 2-rank job read as failed, exit 1).
    """
    exits: list[ExitInfo] = list(state.exits.values())  # arrival order: the first failure first
    launcher = launcher or {}
    if launcher:
        # Timestamps are whole seconds: within one, a SIGTERM'd worker is the launcher's doing, killed
        # by the signal (-15) or ended by its agent's handler of it (143: the rank that died of
        # SIGKILL in the same second was blamed on rank 0's 143 by rank order alone).
        rank = min(launcher, key=lambda r: (_seconds(launcher[r].get("timestamp")),
                                            launcher[r]["exitcode"] in (-signal.SIGTERM, _SIGTERM_CODE), r))
        code = _code_of(int(launcher[rank]["exitcode"]))
        reported = state.exits.get(rank)
        if reported is not None and reported.code == code:
            what = f"failed with {_describe(reported)}" if reported.exc_type else _describe(reported)
        elif launcher[rank]["exitcode"] < 0:
            what = f"killed by {signal_name(-int(launcher[rank]['exitcode']))}"
        else:
            what = f"exited with code {code}"
        if reported is None:
            what += " without reporting (os._exit, a signal, or a crash in native code)"
        step = _last_step(state, rank)
        return code, f"rank {rank} {what}{step}{_consequences(exits, rank)}"
    failing = [e for e in exits if e.code != 0]
    causes = [e for e in failing if e.code != _SIGTERM_CODE]
    where = (lambda e: f" on rank {e.rank}") if nproc > 1 else (lambda e: "")
    if before_stop is not None and not any(e.rank in before_stop for e in causes):
        stopped = [e for e in failing if e.code in _STOP_CODES]
        causes = stopped[:1] or causes
    if causes:
        first = causes[0]
        return first.code, f"{_describe(first)}{where(first)}{_consequences(exits, first.rank) if nproc > 1 else ''}"
    missing = sorted(set(ranks if ranks else range(nproc)) - set(state.exits))
    if failing and missing and nproc > 1:
        code = _code_of(returncode) if returncode else 1
        return code, (f"rank(s) {missing} died without reporting{_last_step(state, missing[0])}"
                      f"{_consequences(exits, missing[0])}")
    if failing:
        first = failing[0]
        return first.code, f"{_describe(first)}{where(first)}"
    if returncode is not None and returncode < 0:
        name = signal_name(-returncode)
        hint = (" (sent by a user, a supervisor, or the kernel's OOM killer when host memory runs out)"
                if name == "SIGKILL" else "")
        return 128 - returncode, f"training process killed by {name}{hint}"
    if returncode and not exits:
        return returncode, f"training process exited with code {returncode} before its agent reported"
    if missing and returncode:
        return returncode, f"rank(s) {missing} died without reporting (exit code {returncode})"
    if exits:
        reason = exits[0].reason
        if exits[0].steps == 0:
            reason += "; the script never called an optimizer step, so no training steps were recorded"
        return (returncode if returncode and not exits else exits[0].code), reason
    if returncode is None:
        return 1, "the controller stopped before the training process reported how it ended"
    return returncode, "completed"


def _last_step(state: SessionState, rank: int) -> str:
    samples = state.steps.get(rank)
    return f" after step {samples[-1].index}" if samples else ""


def stop_note(code: int, reason: str, note: str) -> str:
    """``reason`` with the note on who stopped the job ("the user stopped the job from the TUI"),
    unless the job completed on its own (exit code 0): a stop asked for while its last step ended
    did not stop it, and a job that ran all its 200 steps was reported as stopped by the user."""
    return reason + note if code != 0 else reason
