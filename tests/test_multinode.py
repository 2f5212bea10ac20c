"""Multi-node jobs, in parts: the attach options and launch line, the job id, the command relay
over two spawned gloo ranks, heartbeats over a real TCPStore, the deciding controller, and
merging the sessions of one job (the end-to-end runs are in test_multinode_e2e.py)."""

from __future__ import annotations

import argparse
import json
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from ranks import free_port, spawn_ranks

from advisor.advice import AdviceLoop
from advisor.agent.relay import Heartbeat
from advisor.cli import build_parser, main
from advisor.errors import UsageError
from advisor.job import load_job
from advisor.multinode import MultiNode, from_namespace
from advisor.paths import DB_NAME, new_session_dir
from advisor.records.results import ApplyResult
from advisor.records.samples import Event, ExitInfo, RunInfo, StepSample
from advisor.report import build_report
from advisor.controller import AttachOptions, Session
from advisor.store import SessionStore

RDZV = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400"]


def attach_ns(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(["attach", *args, "train.py"])


# -- launch --------------------------------------------------------------------------------

def test_torchrun_options_pass_through_and_replace_standalone(tmp_path) -> None:
    ns = attach_ns(*RDZV, "--node-rank", "1", "--rdzv-id", "job7", "--max-restarts", "0", "--nproc-per-node", "1")
    multi = from_namespace(ns, environ={})
    assert multi.mode == "torchrun" and multi.active
    session = Session(AttachOptions(script=str(tmp_path / "train.py"), multinode=multi))
    try:
        line = session.command_line()
        launcher = line[line.index("-c") + 2:line.index("--no-python")]
        assert "--standalone" not in launcher
        assert launcher[:7] == ["--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d",
                                "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-id=job7", "--max-restarts=0",
                                "--nproc-per-node=1"]
        config = json.loads(session.environment()["ADVISOR_CONFIG"])
        assert config["multinode"]["relay"] is True
        assert session.job["id"] == "job7" and session.job["node_rank"] == 1
    finally:
        session.close()


def test_one_node_keeps_standalone_and_no_relay(tmp_path) -> None:
    multi = from_namespace(attach_ns("--nproc-per-node", "2"), environ={})
    session = Session(AttachOptions(script=str(tmp_path / "train.py"), nproc_per_node=2, multinode=multi))
    try:
        assert "--standalone" in session.command_line()
        assert json.loads(session.environment()["ADVISOR_CONFIG"])["multinode"] is None
        assert session.job["id"] == session.id and session.decides()
    finally:
        session.close()


def test_outer_launcher_environment_runs_the_rank_without_torchrun(tmp_path) -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n0", "MASTER_PORT": "29500",
           "SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0"}
    multi = from_namespace(attach_ns(), environ=env)
    assert multi.mode == "env" and multi.active
    assert multi.job_id() == ("slurm-812.0", "SLURM_JOB_ID")
    session = Session(AttachOptions(script=str(tmp_path / "train.py"), multinode=multi))
    try:
        line = session.command_line()
        assert "torch.distributed.run" not in " ".join(line)
        assert session.job["rank"] == 3 and session.job["world_size"] == 4
    finally:
        session.close()


@pytest.mark.parametrize("args, env, words", [
    (["--nnodes", "2"], {}, "needs a rendezvous"),
    (RDZV, {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "x"}, "already set"),
    (["--nproc-per-node", "2"], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "x"},
     "--nproc-per-node does not apply"),
    ([], {"RANK": "1"}, "must set all of"),
    ([], {"RANK": "5", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "x"}, "not in [0, WORLD_SIZE=2)"),
])
def test_combinations_that_cannot_work_are_one_line_usage_errors(args, env, words) -> None:
    with pytest.raises(UsageError) as err:
        from_namespace(attach_ns(*args), environ=env)
    assert words in str(err.value) and "\n" not in str(err.value) and err.value.hint


def test_every_node_derives_the_same_job_id_without_rdzv_id() -> None:
    ids = {from_namespace(attach_ns(*RDZV, "--node-rank", str(n)), environ={}).job_id()[0] for n in range(2)}
    other = from_namespace(attach_ns("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29401"), environ={}).job_id()[0]
    assert len(ids) == 1 and other not in ids
    assert MultiNode().job_id() == (None, "single")


# -- decisions -----------------------------------------------------------------------------

class _FakeSession:
    def __init__(self, decides: bool | None) -> None:
        self._decides = decides
        self.job = {"id": "j", "ranks_hosted": [2, 3]}
        self.sent: list[dict] = []

    def decides(self) -> bool | None:
        return self._decides

    def send_command(self, command) -> int:
        self.sent.append(command)
        return 1


def test_a_controller_that_does_not_host_rank_0_refuses_to_apply_or_revert() -> None:
    session = _FakeSession(decides=False)
    loop = AdviceLoop.__new__(AdviceLoop)  # no background thread: only the user actions are tested
    loop.session = session
    assert "not the deciding controller" in loop.apply("anything")
    assert "hosts global rank 0" in loop.revert()
    assert session.sent == []
    loop.session = _FakeSession(decides=None)
    assert "not connected yet" in loop.apply("anything")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_relay_delivers_rank_0s_command_to_both_ranks_at_the_same_boundary(tmp_path) -> None:
    from apply_scripts.relay import APPLY, worker

    spawn_ranks(worker, (2, free_port(), str(tmp_path)), 2, [tmp_path / f"rank{r}.json" for r in range(2)])
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for result in results:
        assert result["delivered"] == [{"step": 3, "command": APPLY}]  # rank 1's own revert never arrives
        assert result["recorded"] == 0  # the relay's broadcasts are not the job's collectives
        tokens = [d["token"] for n, d in result["events"] if n == "job"]
        assert len(tokens) == 1
        relayed = [d for n, d in result["events"] if n == "relayed_command"]
        assert relayed == [{"type": "apply", "step": 3, "from_rank": 0, "recommendation_id": "fused-optimizer",
                            "at_step": 4}]
    assert [d["token"] for n, d in results[0]["events"] if n == "job"] == \
        [d["token"] for n, d in results[1]["events"] if n == "job"]
    ignored = [d["message"] for n, d in results[1]["events"] if n == "warning"]
    assert any("only the controller hosting rank 0 decides" in m for m in ignored)


# -- heartbeats ----------------------------------------------------------------------------

def _beating(rank: int, port: int, events: list, *, watch: bool) -> Heartbeat:
    hb = Heartbeat(rank=rank, world_size=3, watch=watch, every_s=0.1, lost_after_s=1.0,
                   emit=lambda name, data: events.append((name, data)))
    hb._store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=5))
    hb._prefix = "advisor/t/"
    hb._thread = threading.Thread(target=hb._loop, daemon=True)
    hb._thread.start()
    return hb


def test_heartbeat_names_a_silent_peer_and_a_failed_one_but_not_one_that_finished() -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    events: list = []
    watcher = _beating(0, server.port, events, watch=True)
    killed = _beating(1, server.port, [], watch=False)
    failed = _beating(2, server.port, [], watch=False)
    try:
        deadline = time.monotonic() + 10
        while len(watcher._moves) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        killed._stop.set()  # SIGKILL: no word at all
        failed.stop(code=1)  # an exception: it says how it ended
        watcher.settle()
        deadline = time.monotonic() + 10
        while not watcher.lost and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watcher.stop()
    lost = [d for n, d in events if n == "peer_lost"]
    exits = [d for n, d in events if n == "peer_exit"]
    assert [d["ranks"] for d in lost] == [[1]] and "stopped responding" in lost[0]["message"]
    assert [(d["ranks"], d["code"]) for d in exits] == [([2], 1)]


def test_heartbeat_stays_quiet_for_a_peer_that_finished_cleanly() -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    events: list = []
    watcher = _beating(0, server.port, events, watch=True)
    watcher.world_size = 2
    done = _beating(1, server.port, [], watch=False)
    try:
        deadline = time.monotonic() + 10
        while not watcher._moves and time.monotonic() < deadline:
            time.sleep(0.05)
        done.stop(code=0)
        deadline = time.monotonic() + 10
        while 1 not in watcher.ended and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watcher.stop()
    assert watcher.ended == {1: 0}
    assert [n for n, _ in events] == []


# -- one view of the job -------------------------------------------------------------------

def _node_session(job_id: str, ranks: list[int], *, token: str = "t1", decides: bool = False,
                  world: int = 2) -> Path:
    folder = new_session_dir("ddp.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, script="/x/ddp.py", finished=True, exit_code=0, exit_reason="completed",
                   job={"id": job_id, "token": token, "launcher": "torchrun", "ranks_hosted": ranks,
                        "world_size": world, "decides": decides, "node_rank": ranks[0], "hostname": "h"})
    for rank in ranks:
        store.put(RunInfo(script="/x/ddp.py", argv=[], rank=rank, local_rank=0, world_size=world))
        for index in range(3):
            store.put(StepSample(index=index, rank=rank, time_s=0.1 + rank, loss=1.0 / (index + 1)))
        store.put(ApplyResult(remedy="zero", rank=rank, status="kept", at_step=1).event(rank=rank, step=2))
        store.put(ExitInfo(rank=rank, code=0, reason="completed", steps=3))
    store.close()
    return folder


def test_sessions_of_one_job_merge_into_one_report_with_every_rank() -> None:
    node1 = _node_session("j", [1])
    node0 = _node_session("j", [0], decides=True)
    state = load_job([str(node1), str(node0 / DB_NAME)])
    report = build_report(state)
    assert report["run"]["ranks"] == [0, 1]
    assert sorted({s["rank"] for s in report["steps"]}) == [0, 1]
    assert [a["rank"] for a in report["applied"]] == [0, 1]
    job = report["job"]
    assert job["id"] == "j" and job["merged"] and job["token"] == "t1"
    assert [s["ranks"] for s in job["sessions"]] == [[0], [1]]  # the deciding node first
    assert report["session"]["id"] == node0.name


@pytest.mark.parametrize("second, words", [
    (dict(job_id="other"), "different jobs"),
    (dict(job_id="j", token="t2"), "different runs"),
    (dict(job_id="j", ranks=[0]), "rank 0 is in two sessions"),
    (dict(job_id="j", world=4), "world size"),
])
def test_sessions_that_are_not_one_run_of_one_job_are_refused(second, words, capsys) -> None:
    first = _node_session("j", [0], decides=True)
    other = _node_session(**{"ranks": [1], **second})
    with pytest.raises(UsageError) as err:
        load_job([str(first), str(other)])
    assert words in str(err.value)
    assert main(["report", str(first), str(other)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("advisor: error: ") and words in lines[0] and lines[1].startswith("hint: ")


def test_diff_takes_each_side_as_the_sessions_of_one_job(tmp_path) -> None:
    a = [_node_session("a", [0], decides=True), _node_session("a", [1])]
    b = [_node_session("b", [0], decides=True), _node_session("b", [1])]
    out = tmp_path / "diff.json"
    assert main(["diff", ",".join(map(str, a)), ",".join(map(str, b)), "--json", str(out)]) == 0
    diff = json.loads(out.read_text())
    assert diff["schema"] == "advisor.diff/1"
    assert (diff["a"]["job"], diff["a"]["ranks"], diff["b"]["job"], diff["b"]["ranks"]) == ("a", [0, 1], "b", [0, 1])
    assert main(["diff", f"{a[0]},{b[1]}", str(b[0])]) == 2  # one side mixes two jobs


def test_collectives_are_split_into_intra_and_inter_node_links() -> None:
    from advisor.records.samples import CollectiveStat
    from advisor.sections.links import build_links_section, classify
    from advisor.state import SessionState

    runs = {r: RunInfo(script="s", argv=[], rank=r, world_size=4, hostname=f"h{r // 2}") for r in range(4)}
    calls = [CollectiveStat(rank=r, step=1, op="all_reduce", group_size=g, bytes=1000, time_s=0.001)
             for r in range(4) for g in (4, 2)]
    state = SessionState(runs=runs, collectives=calls)
    links = build_links_section(state)
    assert links["nodes"] == {"h0": [0, 1], "h1": [2, 3]}
    rows = {(row["link"], row["group_size"]): row for row in links["links"]}
    assert set(rows) == {("inter_node", 4), ("unknown", 2)}  # a subgroup's members are not recorded
    assert rows[("inter_node", 4)]["busbw"] == pytest.approx(4 * 1000 / 0.004 * 2 * 3 / 4)
    one_host = {r: "h" for r in range(4)}
    assert classify(4, 4, one_host, None) == "intra_node"
    # One node's own session of a torchrun job: the ranks it did not host are on other nodes.
    assert classify(2, 2, {0: "node0"}, {0}) == "inter_node"
    assert classify(2, 2, {0: "h"}, None) == "unknown"


def test_a_node_controller_names_the_lost_peer_first_and_counts_only_its_own_ranks(tmp_path) -> None:
    multi = from_namespace(attach_ns(*RDZV, "--node-rank", "1"), environ={})
    session = Session(AttachOptions(script=str(tmp_path / "train.py"), multinode=multi))
    try:
        session._on_hello(1)  # this node hosts global rank 1 only
        assert session.decides() is False and session.hosted_ranks() == [1]
        session._on_record(Event(rank=1, step=4, name="peer_lost", data={
            "ranks": [0], "silent_s": 10.0, "message": "rank(s) 0 stopped responding (no heartbeat for 10 s)"}))
        session._on_record(ExitInfo(rank=1, code=1, reason="exception", exc_type="RuntimeError",
                                    message="Connection closed by peer", steps=4))
        warnings = [e.data["message"] for e in session.live.snapshot().events if e.name == "warning"]
        assert any("rank(s) 0 stopped responding" in w and "stopped in 30 s" in w for w in warnings)
        code, reason = session.finish(1)
    finally:
        session.close()
    assert code == 1
    assert reason.startswith("rank(s) 0 stopped responding") and "RuntimeError" in reason
    assert "died without reporting" not in reason  # rank 0 is not this node's to report


def test_max_restarts_alone_stays_on_one_node_and_reaches_torchrun(tmp_path) -> None:
    multi = from_namespace(attach_ns("--nproc-per-node", "2", "--max-restarts", "3"), environ={})
    assert multi.mode == "single" and not multi.active
    session = Session(AttachOptions(script=str(tmp_path / "train.py"), nproc_per_node=2, multinode=multi))
    try:
        line = session.command_line()
        assert line.count("--standalone") == 1 and "--max-restarts=3" in line
    finally:
        session.close()
