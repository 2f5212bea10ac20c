"""Step time on the device's timeline (CUDA): the host's time of a step counts its kernel launches,
which on a step after a synchronised one are a fraction of its kernels (an H200 GPT: 20 ms of
launches, 130 ms of kernels), and the predictions' baseline read that. The agent pairs a timing
event where each step began with one at its boundary; the profile's baseline reads that time."""

from __future__ import annotations

import itertools

import pytest
import torch

from advisor.agent.agent import Agent
from advisor.agent.hooks import install
from advisor.recommend.profile import profile_from_records
from advisor.records.samples import StepSample
from advisor.records.settings import AgentSettings


class _Clock:
    now = 0.0


class FakeEvent:
    """torch.cuda.Event on a CPU build: the time an event is recorded is a clock the test moves."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t: float | None = None

    def record(self, stream: object = None) -> None:
        self.t = _Clock.now

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.t - self.t) * 1e3


def test_the_agent_pairs_an_event_where_each_step_began_with_one_at_its_boundary(monkeypatch) -> None:
    """Each step's device time runs from its start event (recorded after the advisor's own
    boundary work) to its boundary event: the device clock advances 0.75 s per step while the
    host's barely moves, and 10 s of advisor work at each boundary is in no step."""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    streams: list = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams.append(device))
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    emitted: list = []
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=()))
    after_boundary = agent.boundaries._after_boundary

    def advisor_work(**kw):
        _Clock.now += 10.0
        after_boundary(**kw)

    monkeypatch.setattr(agent.boundaries, "_after_boundary", advisor_work)
    hooks = install(agent)
    try:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        agent.objects.device = torch.device("cuda")  # from here on, as a CUDA model's parameters make it
        for _ in range(3):
            _Clock.now += 0.5
            model(torch.randn(2, 4)).sum().backward()
            _Clock.now += 0.25
            opt.step()
        agent.flush(sync=True)
    finally:
        hooks.remove()
        agent.close()
    steps = [r for r in emitted if isinstance(r, StepSample)]
    assert [s.index for s in steps] == [0, 1, 2, 3]
    # Steps 0 and 1 began while the job was on the CPU: no start event, no device time.
    assert [s.device_time_s for s in steps[:2]] == [None, None]
    assert [round(s.device_time_s, 6) for s in steps[2:]] == [0.75, 0.75]
    assert all(s.time_s < 0.5 for s in steps)  # the host's clock barely moved
    # What the executor times its before and after windows with (apply/executor.py::_on_device).
    assert {i: round(t, 6) for i, t in agent.context.device_step_times().items()} == {2: 0.75, 3: 0.75}
    assert streams and all(d == torch.device("cuda") for d in streams)  # the job's device's stream


def test_the_baseline_step_time_is_the_device_time_where_there_is_one() -> None:
    steps = [StepSample(index=i, time_s=0.02, deep=i in (1, 2, 3), device_time_s=0.13 if i else None)
             for i in range(6)]
    profile = profile_from_records(steps=steps)
    assert profile.step_time_s == pytest.approx(0.13)
    host_only = [StepSample(index=i, time_s=0.02) for i in range(3)]
    assert profile_from_records(steps=host_only).step_time_s == pytest.approx(0.02)


@pytest.mark.gpu
def test_on_cuda_a_step_after_a_synchronised_boundary_reads_its_kernels(monkeypatch) -> None:
    """The boundary synchronises (as the agent's own work after a deep step does), then a step
    sleeps 25 ms on the device: its launches return at once (time_s small), its device time is
    the sleep's, read from the sleep's own events."""
    torch.cuda.init()
    model = torch.nn.Linear(8, 8).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    emitted: list = []
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=()))
    after_boundary = agent.boundaries._after_boundary

    def synchronised(**kw):
        torch.cuda.synchronize()
        after_boundary(**kw)

    monkeypatch.setattr(agent.boundaries, "_after_boundary", synchronised)
    # Load every kernel the steps launch first: with lazy module loading (CUDA's default) the
    # first launch of a kernel can wait for the device, and in a fresh process step 1's first
    # gradient accumulation did, so its host time read the sleep (26.5 ms for 26.0 ms of kernels).
    for _ in range(2):
        torch.cuda._sleep(1000)
        model(torch.randn(4, 8, device="cuda")).sum().backward()
        opt.step()
    torch.cuda.synchronize()
    hooks = install(agent)
    references = []
    try:
        for _ in range(4):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(50_000_000)
            model(torch.randn(4, 8, device="cuda")).sum().backward()
            end.record()
            opt.step()
            references.append((start, end))
        agent.flush(sync=True)
    finally:
        hooks.remove()
        agent.close()
    steps = [r for r in emitted if isinstance(r, StepSample)]
    assert steps[0].device_time_s is None  # step 0 began before any boundary: no start event
    for s, (start, end) in itertools.islice(zip(steps, references), 1, None):
        kernels = start.elapsed_time(end) / 1e3
        assert s.device_time_s == pytest.approx(kernels, rel=0.15, abs=2e-3), (s.device_time_s, kernels)
        assert s.time_s < 0.5 * kernels, (s.time_s, kernels)  # the host returned from the launches long before
        assert agent.context.device_step_times()[s.index] == s.device_time_s  # the executor's windows read these
