"""A rank that dies while the others run is named at once, and the job is stopped after a grace period."""

import subprocess
import time

import advisor.controller as session_module
from advisor.agent.channel import AgentChannel
from advisor.records.samples import ExitInfo, StepSample
from advisor.controller import AttachOptions, Session


def _wait(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.02)


def test_a_silent_rank_death_is_said_at_once_and_ends_the_job(tmp_path, monkeypatch):
    monkeypatch.setattr(session_module, "DEAD_RANK_GRACE_S", 0.5)
    script = tmp_path / "train.py"
    script.write_text("")
    session = Session(AttachOptions(script=str(script), nproc_per_node=2))
    session.process = subprocess.Popen(["sleep", "60"])  # stands in for a job blocked in a collective
    secret = session._secret
    ranks = [AgentChannel(session.server.path, secret, spill_path=None, rank=r) for r in (0, 1)]
    try:
        _wait(lambda: session.server.connections == 2)
        assert not session._secret_file.exists()  # every rank said hello: the secret is gone
        ranks[1].emit({"kind": "step", "data": StepSample(index=3, rank=1, time_s=0.1).to_dict()})
        _wait(lambda: session.live.snapshot().steps)
        ranks[1].close(2)  # dies without an exit record (os._exit, SIGKILL)
        _wait(lambda: any(e.name == "warning" for e in session.live.snapshot().events))
        warning = next(e for e in session.live.snapshot().events if e.name == "warning").data["message"]
        assert warning.startswith("rank 1 stopped reporting") and "after step 3" in warning
        assert "rank 0 may be waiting for it" in warning
        assert session.process.wait(timeout=20) == -15  # stopped after the grace period, not 60 s
        # The stop was the dead rank's consequence, not the user's: the verdict names the dead rank.
        ranks[0].emit({"kind": "exit", "data": ExitInfo(rank=0, code=143, reason="terminated by SIGTERM").to_dict()})
        _wait(lambda: session.live.snapshot().exits)
        code, reason = session.verdict(session.live.snapshot(), -15)
        assert reason.startswith("rank(s) [1] died without reporting after step 3"), reason
    finally:
        ranks[0].close(2)
        if session.process.poll() is None:
            session.process.kill()
        session.close()
