"""torchrun's own restarts (``--max-restarts``) under ``advisor attach``: the restarted workers
start through the same bootstrap, so what they need from the controller must still be there."""

from __future__ import annotations

import threading
from pathlib import Path

from advisor.multinode import MultiNode
from advisor.controller import AttachOptions, Session

ROOT = Path(__file__).resolve().parents[1]


def _session_after_every_hello(multinode: MultiNode) -> Session:
    session = Session(AttachOptions(script=str(ROOT / "tests" / "scripts" / "tiny_train.py"), nproc_per_node=2,
                                    multinode=multinode))
    for rank in (0, 1):  # what the channel server does on each rank's valid hello
        session.server.ranks.add(rank)
        session._on_hello(rank)
    return session


def test_the_secret_stays_for_restarted_workers_and_goes_at_close() -> None:
    """Removed once every rank had said hello, the secret was gone when torchrun restarted the
    workers, and each new worker died in the bootstrap (FileNotFoundError): under the advisor, the
    restart the user asked for failed where plain torchrun recovered."""
    restarting = _session_after_every_hello(MultiNode(mode="single", options={"max_restarts": 1}))
    try:
        assert (restarting.dir / "secret").exists()
    finally:
        restarting.close()
    assert not (restarting.dir / "secret").exists()
    plain = _session_after_every_hello(MultiNode())
    try:
        assert not (plain.dir / "secret").exists()  # no restart possible: nothing left behind
    finally:
        plain.close()


def test_max_restarts_is_read_from_the_options_as_given() -> None:
    assert MultiNode(mode="torchrun", options={"max_restarts": "3"}).restarts == 3
    assert MultiNode(mode="single", options={"max_restarts": 0}).restarts == 0
    assert MultiNode().restarts == 0


def test_a_kill_reaches_the_ranks_that_torchrun_can_no_longer_stop() -> None:
    """Stopping a job escalates to SIGKILL; sent to torchrun alone, it left its workers running
    (orphans, seen after a hung restart). The ranks the agents named are killed with it."""
    import os
    import time

    session = Session(AttachOptions(script=str(ROOT / "tests" / "scripts" / "ignores_sigterm.py"),
                                    nproc_per_node=2, capture_output=True))
    session.start()
    try:
        deadline = time.monotonic() + 60
        while len(session.live.snapshot().runs) < 2:
            assert time.monotonic() < deadline, "the ranks never said hello"
            assert session.poll() is None
            time.sleep(0.05)
        while (session.dir / "output.log").read_text().count("ready") < 2:  # both now ignore SIGTERM
            assert time.monotonic() < deadline, "the ranks never got to the script"
            time.sleep(0.05)
        pids = [run.pid for run in session.live.snapshot().runs.values()]
        session.terminate(grace=1.0)  # torchrun waits 30 s for workers that ignore SIGTERM: killed
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in pids)
    finally:
        if session.poll() is None:
            session.kill()
        session.wait()
        session.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"  # a zombie is dead, waiting for its reaper
    except OSError:
        return False


def _warnings(session: Session) -> list[str]:
    return [e.data["message"] for e in session.live.snapshot().events if e.name == "warning"]


def test_a_dead_rank_does_not_stop_a_job_that_torchrun_will_restart() -> None:
    """The dead-rank stop (30 s after a rank died while others run) raced the restart the user
    asked for: torchrun restarts every worker itself while restarts remain."""
    restarting = _session_after_every_hello(MultiNode(mode="single", options={"max_restarts": 1}))
    plain = _session_after_every_hello(MultiNode())
    try:
        for session in (restarting, plain):
            session._gone.append(1)
            session._warn_dead_rank()
        assert restarting._dead_rank_timer is None
        assert any("torchrun restarts the workers (restart 1 of --max-restarts 1)" in m
                   for m in _warnings(restarting))
        assert plain._dead_rank_timer is not None and plain._dead_rank_timer.is_alive()  # the stop, as before
        assert any("the job is stopped in" in m for m in _warnings(plain))
    finally:
        if plain._dead_rank_timer is not None:
            plain._dead_rank_timer.cancel()
        restarting.close()
        plain.close()


def test_restarted_workers_are_said_once_counted_in_the_report_and_clear_the_dead_ranks() -> None:
    from advisor.records.samples import RunInfo
    from advisor.report import run_section

    session = _session_after_every_hello(MultiNode(mode="single", options={"max_restarts": 2}))
    try:
        session._gone.append(1)
        session._dead_rank_timer = pending = threading.Timer(60.0, lambda: None)
        pending.start()
        for rank in (0, 1):
            session._on_record(RunInfo(script="t.py", argv=[], rank=rank, world_size=2, restart_count=1))
        restarted = [m for m in _warnings(session) if "restarted the workers" in m]
        assert restarted == ["torchrun restarted the workers (restart 1 of --max-restarts 2): "
                             "their steps count from 0 again"]
        assert session._gone == [] and session._dead_rank_timer is None and pending.finished.is_set()
        assert run_section(session.live.snapshot())["restarts"] == 1
    finally:
        pending.cancel()
        session.close()
