"""The first failing rank and its own code are blamed; what the launcher did after is a consequence."""

import json

from advisor.exits import LAUNCHER_EXITS, decide_exit, read_launcher_exits
from advisor.records.samples import ExitInfo, StepSample
from advisor.state import LiveState

SIGTERM_EXIT = ExitInfo(rank=0, code=143, reason="terminated by SIGTERM", steps=3)


def _state(*records):
    live = LiveState()
    for record in records:
        live.add(record)
    return live.snapshot()


def test_launcher_record_names_the_rank_that_exited_first_with_its_own_code(tmp_path):
    (tmp_path / LAUNCHER_EXITS).write_text(json.dumps({
        "0": {"exitcode": -15, "timestamp": 100, "signal": "SIGTERM"},
        "1": {"exitcode": 9, "timestamp": 100, "signal": None}}))
    launcher = read_launcher_exits(tmp_path)
    state = _state(StepSample(index=2, rank=1, time_s=0.1), SIGTERM_EXIT)
    code, reason = decide_exit(state, 1, 2, launcher)
    assert code == 9
    assert reason.startswith("rank 1 exited with code 9") and "after step 2" in reason
    assert "consequence: rank 0 stopped by SIGTERM" in reason


def test_a_rank_its_agent_ended_on_the_launchers_sigterm_is_not_the_cause(tmp_path):
    """torchrun records a worker whose agent handled the SIGTERM as exit code 143, not -15; in the
    same second as another rank's SIGKILL, rank order alone blamed rank 0 (a suite run, 143)."""
    (tmp_path / LAUNCHER_EXITS).write_text(json.dumps({
        "1": {"exitcode": -9, "timestamp": 100, "signal": "SIGKILL"},
        "0": {"exitcode": 143, "timestamp": 100, "signal": None}}))
    code, reason = decide_exit(_state(SIGTERM_EXIT), 143, 2, read_launcher_exits(tmp_path))
    assert (code, reason.split(" without")[0]) == (137, "rank 1 killed by SIGKILL")
    assert "consequence: rank 0 stopped by SIGTERM" in reason


def test_signal_death_in_the_launcher_record_is_128_plus_the_signal(tmp_path):
    (tmp_path / LAUNCHER_EXITS).write_text(json.dumps({"1": {"exitcode": -9, "timestamp": 5}}))
    code, reason = decide_exit(_state(SIGTERM_EXIT), 1, 2, read_launcher_exits(tmp_path))
    assert (code, reason.split(" without")[0]) == (137, "rank 1 killed by SIGKILL")


def test_unreadable_launcher_record_is_ignored(tmp_path):
    (tmp_path / LAUNCHER_EXITS).write_text('{"1": {"exitcode": "nine"}, "x": 3}')
    assert read_launcher_exits(tmp_path) == {}
    (tmp_path / LAUNCHER_EXITS).write_text("[[[")
    assert read_launcher_exits(tmp_path) == {}


def test_sigterm_exits_are_consequences_even_when_they_arrive_first():
    failed = ExitInfo(rank=1, code=1, reason="exception", exc_type="ValueError", message="bad shard")
    code, reason = decide_exit(_state(SIGTERM_EXIT, failed), 1, 2)
    assert code == 1
    assert reason.startswith("ValueError: bad shard on rank 1")
    assert "rank 0 stopped by SIGTERM" in reason


def test_after_a_stop_the_stop_is_the_cause_and_a_broken_collective_its_consequence():
    """The user stopped a 2-rank job (the TUI's stop, Ctrl-C): rank 0 ended by the SIGTERM, rank 1's gloo
    collective then lost its peer and raised. The job was stopped, not failed (a live DDP test in
    CI read exit 1); a rank that had failed before the stop stays the cause."""
    broken = ExitInfo(rank=1, code=1, reason="exception", exc_type="RuntimeError",
                      message="Connection closed by peer")
    state = _state(broken, SIGTERM_EXIT)
    assert decide_exit(state, 1, 2)[0] == 1  # nobody stopped it: the exception is the cause
    code, reason = decide_exit(state, 1, 2, before_stop=frozenset())
    assert code == 143
    assert reason == "terminated by SIGTERM on rank 0; then, as a consequence: rank 1 RuntimeError"
    code, reason = decide_exit(state, 1, 2, before_stop=frozenset({1}))  # it failed first
    assert code == 1 and reason.startswith("RuntimeError: Connection closed by peer on rank 1")
    interrupted = ExitInfo(rank=0, code=130, reason="interrupted (Ctrl-C)", steps=3)
    code, reason = decide_exit(_state(broken, interrupted), 1, 2, before_stop=frozenset())
    assert code == 130 and reason.startswith("interrupted (Ctrl-C) on rank 0")


def test_a_rank_that_never_reported_is_blamed_over_the_sigterm_it_caused():
    code, reason = decide_exit(_state(SIGTERM_EXIT), 1, 2)
    assert code == 1
    assert reason.startswith("rank(s) [1] died without reporting")


def test_sigkill_is_not_blamed_on_the_oom_killer_as_a_fact():
    code, reason = decide_exit(_state(), -9, 1)
    assert code == 137
    assert reason.startswith("training process killed by SIGKILL")
    assert "OOM killer" not in reason.split("(")[0]
    assert "or the kernel's OOM killer" in reason


def test_a_launcher_that_leaves_the_rendezvous_says_how(tmp_path):
    """A node whose other node never comes: torchrun raises a RendezvousError, not ChildFailedError,
    and its workers never start; the launcher's record is what tells the user why."""
    import os
    import subprocess
    import sys

    from ranks import free_port

    from advisor.exits import LAUNCHER_CODE, read_rendezvous_failure, rendezvous_lost_reason

    run = subprocess.run(
        [sys.executable, "-c", LAUNCHER_CODE, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-conf", "join_timeout=3", "--rdzv-id", "alone",
         os.devnull],
        env={**os.environ, "ADVISOR_LAUNCHER_EXITS": str(tmp_path / LAUNCHER_EXITS)},
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert read_launcher_exits(tmp_path) == {}  # no worker ran, so none failed
    error = read_rendezvous_failure(tmp_path)
    assert error == "RendezvousTimeoutError"
    assert "--rdzv-endpoint" in rendezvous_lost_reason(error)
    assert (tmp_path / LAUNCHER_EXITS).stat().st_mode & 0o077 == 0


def test_an_unknown_or_malformed_rendezvous_record_is_read_safely(tmp_path):
    from advisor.exits import read_rendezvous_failure, rendezvous_lost_reason

    (tmp_path / LAUNCHER_EXITS).write_text(json.dumps({"rendezvous": {"error": "os.system('x')"}}))
    assert read_rendezvous_failure(tmp_path) is None
    (tmp_path / LAUNCHER_EXITS).write_text(json.dumps({"rendezvous": {"error": "RendezvousStateError"}}))
    assert rendezvous_lost_reason(read_rendezvous_failure(tmp_path)).endswith("it failed in it")
