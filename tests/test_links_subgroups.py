"""comm_links places a sub-group's calls by the members the record names (``group_ranks``):
classify, the record's validation, the Kineto import, and the comm probe on 3 spawned gloo ranks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fakes import FakeContext
from ranks import free_port, spawn_ranks

from advisor.importers.kineto import import_traces
from advisor.intake import MAX_RANKS, RecordError, parse_record
from advisor.probes.comm import intercept
from advisor.probes.comm.probe import CommProbe
from advisor.records.samples import CollectiveStat, RunInfo
from advisor.sections.links import build_links_section, classify
from advisor.state import LiveState, SessionState

TWO_NODES = {0: "a", 1: "a", 2: "b", 3: "b"}  # 4 ranks, 2 per node


def test_a_subgroup_is_placed_by_its_members():
    assert classify(2, 4, TWO_NODES, None, [0, 1]) == "intra_node"
    assert classify(2, 4, TWO_NODES, None, [2, 3]) == "intra_node"
    assert classify(2, 4, TWO_NODES, None, [1, 2]) == "inter_node"
    assert classify(2, 4, TWO_NODES, None) == "unknown"  # members not recorded (older sessions)
    assert classify(2, 4, {0: "a", 1: "a"}, None, [1, 2]) == "unknown"  # rank 2's node is not known
    assert classify(4, 4, TWO_NODES, None) == "inter_node"  # the world, as before
    # One node's own session of a torchrun job: a sub-group of its own ranks stays within it.
    assert classify(2, 4, {0: "node0", 1: "node0"}, {0, 1}, [0, 1]) == "intra_node"
    assert classify(2, 4, {0: "node0", 1: "node0"}, {0, 1}, [1, 2]) == "inter_node"


def test_links_section_splits_subgroups_by_node():
    runs = {r: RunInfo(script="s", argv=[], rank=r, world_size=4, hostname=TWO_NODES[r]) for r in range(4)}
    calls = [CollectiveStat(rank=r, step=1, op="all_reduce", group_size=2, bytes=1000, time_s=0.001,
                            group_ranks=[0, 1] if r < 2 else [2, 3]) for r in range(4)]
    calls += [CollectiveStat(rank=r, step=1, op="all_gather", group_size=2, bytes=1000, time_s=0.001,
                             group_ranks=[1, 2]) for r in (1, 2)]
    calls += [CollectiveStat(rank=0, step=1, op="broadcast", group_size=2, bytes=1000, time_s=0.001)]
    links = build_links_section(SessionState(runs=runs, collectives=calls))
    rows = {(row["link"], row["op"]): row["ranks"] for row in links["links"]}
    assert rows == {("intra_node", "all_reduce"): [0, 1, 2, 3], ("inter_node", "all_gather"): [1, 2],
                    ("unknown", "broadcast"): [0]}


def _collective(**changes) -> dict:
    return {**CollectiveStat(rank=0, step=1, op="all_reduce", group_size=2, bytes=8).to_dict(), **changes}


def test_group_ranks_are_checked_on_arrival():
    assert parse_record("collective", _collective(group_ranks=[0, 3])).group_ranks == [0, 3]
    assert parse_record("collective", _collective(group_ranks=None)).group_ranks is None
    older = _collective()
    del older["group_ranks"]  # a session recorded before the field
    assert parse_record("collective", older).group_ranks is None
    for bad in ([-1, 0], [0, 1.5], [True, False], "0,1", {"0": 1}, [[0]], [0, 2**64],
                list(range(MAX_RANKS + 1))):
        with pytest.raises(RecordError, match="group_ranks"):
            parse_record("collective", _collective(group_ranks=bad))


def test_server_drops_a_collective_with_malformed_group_ranks():
    import time

    from advisor.agent.channel import AgentChannel
    from advisor.records.wire import new_secret
    from advisor.server import ChannelServer

    secret = new_secret()
    received = []
    server = ChannelServer(secret, received.append)
    channel = AgentChannel(server.path, secret, spill_path=None)
    try:
        channel.emit({"kind": "collective", "data": _collective(step=0, group_ranks=[0, 1])})
        channel.emit({"kind": "collective", "data": _collective(step=1, group_ranks=[0, -1])})
        channel.emit({"kind": "collective", "data": _collective(step=2)})
        deadline = time.monotonic() + 10
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [(r.step, r.group_ranks) for r in received] == [(0, [0, 1]), (2, None)]
        assert server.rejected == 1 and "collective.group_ranks" in server.last_rejection
    finally:
        channel.close(2)
        server.close()


def test_members_are_looked_up_once_per_group(tmp_path, monkeypatch):
    looked_up = []
    real = dist.get_process_group_ranks
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda pg: looked_up.append(pg) or real(pg))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        sub = dist.new_group([0])
        seen = intercept.CollectiveInterceptor()
        seen.install()
        try:
            for _ in range(3):
                dist.all_reduce(torch.ones(2))
                dist.all_reduce(torch.ones(2), group=sub)
        finally:
            seen.uninstall()
        assert len(seen.calls) == 6 and seen.errors == 0
        assert len(looked_up) == 2  # the world and the sub-group, once each
        assert all(c.group_ranks is None for c in seen.calls)  # a world of one: every group is the world
    finally:
        dist.destroy_process_group()


def _pg_trace(path: Path) -> Path:
    def call(ts: int, group: str, size: int) -> list[dict]:
        return [{"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": ts, "dur": 10,
                 "args": {"Input Dims": [[[256]], [], [], [], [], []], "Input type": ["TensorList", "", "", "", "Scalar",
                                                                                   "Scalar"]}},
                {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": ts + 2, "dur": 5,
                 "args": {"Collective name": "allreduce", "Group size": size, "Process Group Name": group, "Seq": 0,
                          "In msg nelems": 256, "Out msg nelems": 256, "dtype": "Float"}}]

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0,
               "dur": 1000},
              *call(100, "0", 4), *call(300, "1", 2)]
    pg_config = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
                 {"pg_name": "1", "pg_desc": "undefined", "pg_size": 2, "ranks": [0, 1]}]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "distributedInfo": {
        "backend": "nccl", "rank": 1, "world_size": 4, "pg_count": 2, "pg_config": pg_config}}))
    return path


def test_kineto_import_names_the_members_of_a_named_subgroup(tmp_path):
    result = import_traces([_pg_trace(tmp_path / "rank1.json")])
    calls = [(c.group_size, c.group_ranks) for c in result.records if isinstance(c, CollectiveStat)]
    assert calls == [(4, None), (2, [0, 1])]


# -- the comm probe on 3 spawned gloo ranks ------------------------------------------------

HOSTS = {0: "a", 1: "a", 2: "b"}


def _subgroup_ranks(rank: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=3)
    try:
        ctx = FakeContext(rank=rank, world_size=3)
        probe = CommProbe()
        probe.attach(ctx)
        pairs = {(0, 1): dist.new_group([0, 1]), (1, 2): dist.new_group([1, 2])}  # every rank makes each
        ctx.phase = "forward"
        probe.on_phase(ctx, "forward", 0.0)
        for _ in range(2):
            dist.all_reduce(torch.ones(8))
            for members, group in pairs.items():
                if rank in members:
                    dist.all_reduce(torch.ones(4), group=group)
        probe.on_step_end(ctx, 0)
        probe.detach(ctx)
        records = [{"kind": r.KIND, **r.to_dict()} for r in ctx.emitted]
        Path(out, f"rank{rank}.json").write_text(json.dumps(records))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_probe_records_the_members_of_a_new_group(tmp_path):
    results = [tmp_path / f"rank{r}.json" for r in range(3)]
    spawn_ranks(_subgroup_ranks, (free_port(), str(tmp_path)), 3, results)
    live = LiveState()
    for rank in range(3):
        live.add(RunInfo(script="s", argv=[], rank=rank, world_size=3, hostname=HOSTS[rank]))
        for rec in json.loads(results[rank].read_text()):
            live.add(parse_record(rec.pop("kind"), rec))  # as the controller checks what arrives
    state = live.snapshot()
    seen = {(c.rank, c.group_size, tuple(c.group_ranks or ())) for c in state.collectives}
    assert seen == {(0, 3, ()), (1, 3, ()), (2, 3, ()),  # the world: no list, its size says it
                    (0, 2, (0, 1)), (1, 2, (0, 1)), (1, 2, (1, 2)), (2, 2, (1, 2))}
    rows = {(row["link"], row["group_size"]): row for row in build_links_section(state)["links"]}
    assert set(rows) == {("inter_node", 3), ("intra_node", 2), ("inter_node", 2)}
    assert rows[("intra_node", 2)]["ranks"] == [0, 1] and rows[("inter_node", 2)]["ranks"] == [1, 2]
    assert rows[("intra_node", 2)]["calls"] == 4  # 2 steps' calls on each of ranks 0 and 1
