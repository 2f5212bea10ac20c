"""CommProbe and its interceptor in this process, on a gloo world of one (fast, no spawn)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from fakes import FakeContext

from advisor.probes.comm.bench import main as bench_main
from advisor.probes.comm.probe import CommProbe
from advisor.records.settings import AgentSettings


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _phase(probe: CommProbe, ctx: FakeContext, name: str) -> None:
    ctx.phase = name
    probe.on_phase(ctx, name, time.perf_counter())


def _overlapped_all_reduce(probe: CommProbe, ctx: FakeContext, step: int) -> None:
    """Step ``step``: an async all-reduce issued in backward, compute while it runs, its wait after."""
    _phase(probe, ctx, "backward")
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    a = torch.randn(200, 200)
    for _ in range(20):  # compute while the all-reduce runs
        a = a @ a / 200
    _phase(probe, ctx, "other")
    work.wait()
    probe.on_step_end(ctx, step)


def test_explicit_calls_recorded_with_bytes_and_seq(world_of_one):
    ctx = FakeContext(settings=AgentSettings())
    probe = CommProbe()
    probe.attach(ctx)
    try:
        _phase(probe, ctx, "forward")
        t = torch.arange(10, dtype=torch.float32)
        dist.all_reduce(t)
        dist.broadcast(torch.zeros(3, dtype=torch.int64), src=0)
        out = torch.zeros(4)
        dist.all_gather_into_tensor(out, torch.ones(4))
        _phase(probe, ctx, "other")
        probe.on_step_end(ctx, 0)
    finally:
        probe.detach(ctx)
    stats = ctx.of_kind("collective")
    assert [(s.op, s.bytes, s.dtype, s.group_size) for s in stats] == [
        ("all_reduce", 40, "float32", 1),
        ("broadcast", 24, "int64", 1),
        ("all_gather", 16, "float32", 1),
    ]
    assert t.tolist() == list(range(10))  # the call itself ran unchanged
    for s in stats:
        assert s.step == 0 and 0 <= s.exposed_s <= s.time_s
        # a synchronous call blocks the main thread: exposed although issued in "forward"
        assert s.exposed_s == pytest.approx(s.time_s)
    (seq_event,) = [e for e in ctx.of_kind("event") if e.name == "collective_seq"]
    assert [row["seq"] for row in seq_event.data["calls"]] == [0, 1, 2]
    assert [row["start"] for row in seq_event.data["calls"]] == [s.start for s in stats]


def test_async_work_overlapped_by_compute_is_not_exposed(world_of_one):
    ctx = FakeContext()
    probe = CommProbe()
    probe.attach(ctx)
    try:
        _overlapped_all_reduce(probe, ctx, 0)
    finally:
        probe.detach(ctx)
    (stat,) = ctx.of_kind("collective")
    assert stat.time_s > 0
    assert stat.exposed_s < stat.time_s  # it finished while the main thread computed


def test_steps_without_collectives_book_nothing_and_the_first_call_is_timed_as_ever(world_of_one):
    """Before any collective the probe follows the phase under way and books nothing (its light
    steps' cost on a one-process job); a first call then gets the compute of the phase it was
    issued in, as on a probe that saw calls all along."""
    ctx = FakeContext()
    probe = CommProbe()
    probe.attach(ctx)
    try:
        for step in range(3):
            for name in ("forward", "backward", "optimizer", "other"):
                _phase(probe, ctx, name)
            probe.on_step_end(ctx, step)
            assert probe._compute == [] and probe._quiet_so_far
        ctx.step = 3
        _overlapped_all_reduce(probe, ctx, 3)
    finally:
        probe.detach(ctx)
    (stat,) = ctx.of_kind("collective")
    assert stat.step == 3 and 0 <= stat.exposed_s < stat.time_s  # the backward's compute covered it


def test_detach_removes_interception(world_of_one):
    ctx = FakeContext()
    probe = CommProbe()
    orig_wait = torch._C._distributed_c10d.Work.wait
    probe.attach(ctx)
    assert torch._C._distributed_c10d.Work.wait is not orig_wait
    probe.detach(ctx)
    assert torch._C._distributed_c10d.Work.wait is orig_wait
    dist.all_reduce(torch.ones(2))
    probe.on_step_end(ctx, 0)
    assert ctx.of_kind("collective") == []


def test_ddp_on_world_of_one_sees_reducer(world_of_one):
    model = torch.nn.Linear(6, 3)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ctx = FakeContext([model])
    probe = CommProbe()
    probe.attach(ctx)
    try:
        _phase(probe, ctx, "forward")
        loss = ddp(torch.randn(4, 6)).sum()
        _phase(probe, ctx, "backward")
        loss.backward()
        _phase(probe, ctx, "optimizer")
        probe.on_step_end(ctx, 0)
    finally:
        probe.detach(ctx)
    reduced = [s for s in ctx.of_kind("collective") if s.op == "all_reduce"]
    assert sum(s.bytes for s in reduced) == (6 * 3 + 3) * 4


def test_bench_requires_distributed_launch(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert bench_main(["--iters", "1"]) == 2
    assert "torch.distributed.run" in capsys.readouterr().err


@pytest.mark.gpu
def test_nccl_world_of_one_reads_kernel_times(tmp_path):
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ctx = FakeContext()
        ctx.device = torch.device("cuda", 0)
        probe = CommProbe()
        probe.attach(ctx)
        x = torch.ones(1 << 22, device="cuda")
        probe.start_deep(ctx, 0)
        _phase(probe, ctx, "backward")
        y = x * 2
        dist.all_reduce(y)
        _phase(probe, ctx, "other")
        torch.cuda.synchronize()
        probe.stop_deep(ctx, 0)
        probe.on_step_end(ctx, 0)
        ctx.step = 1
        dist.all_reduce(y)  # a light step: estimated from the deep step's kernel time
        torch.cuda.synchronize()
        probe.on_step_end(ctx, 1)
        probe.detach(ctx)
        stats = ctx.of_kind("collective")
        assert [s.step for s in stats] == [0, 1]
        assert all(s.bytes == 4 << 22 and 0 <= s.exposed_s <= s.time_s for s in stats)
        assert stats[0].time_s > 0
    finally:
        dist.destroy_process_group()


def test_no_kernel_profiler_for_a_cuda_job_without_a_process_group(monkeypatch):
    """A single-GPU job has no collectives: the comm probe must not open a kineto session (on an
    H100 one opened beside the compute probe's crashed the training process in ``events()``)."""
    opened = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.profiler, "profile", lambda *a, **k: opened.append(k))
    ctx = FakeContext([], [])
    ctx.device = torch.device("cuda", 0)
    probe = CommProbe()
    probe.start_deep(ctx, 0)
    assert opened == [] and probe._profiler is None
