"""A long run's deep steps and light memory samples grow with the logarithm of its length."""

from __future__ import annotations

from advisor.probes.memory.light_series import LightSeries
from advisor.records.samples import MemorySample
from advisor.records.schedule import light_sample_bucket, periodic_deep_due
from advisor.report import build_report
from advisor.state import LiveState
from fakes import Emitted


def test_periodic_deep_steps_back_off_after_ten_at_each_period():
    deep = [s for s in range(1, 10**6 + 1) if periodic_deep_due(s, 100)]
    assert deep[:10] == list(range(100, 1001, 100))  # a short run's schedule is what it was
    assert deep[10:13] == [1200, 1400, 1600] and deep[19:22] == [3000, 3400, 3800]
    assert max(b - a for a, b in zip(deep, deep[1:])) == 6400  # capped at 64x
    assert len(deep) < 250  # not 10,000
    assert not any(periodic_deep_due(s, 0) for s in range(1, 500))


def test_buckets_double_with_the_run_and_never_straddle():
    assert light_sample_bucket(19_999) == (19_999, 1)
    assert light_sample_bucket(20_000) == light_sample_bucket(20_001) == (10_000, 2)
    assert light_sample_bucket(40_000)[1] == 4 and light_sample_bucket(10**6)[1] == 64


def _sample(step: int, total: int, event: str = "optimizer_start") -> MemorySample:
    return MemorySample(step=step, time=0.0, event=event, total_bytes=total, categories={"other": total})


def test_the_largest_sample_of_each_bucket_is_sent_and_says_how_many_steps_it_stands_for():
    series = LightSeries(full=10)
    sent = []
    for step in range(60):
        total = 1000 + (step * 37) % 11  # a different largest in every bucket
        sent += series.offer(_sample(step, total))
    sent += series.flush()
    assert [s.step for s in sent[:20]] == list(range(20)) and all(s.steps_covered == 1 for s in sent[:20])
    later = sent[20:]
    assert sum(s.steps_covered for s in later) == 40  # every light step stood for once
    for s in later:
        _, size = light_sample_bucket(s.step, 10)
        first = s.step // size * size
        assert s.total_bytes == max(1000 + (k * 37) % 11 for k in range(first, first + size))
    assert len(later) == 20 // 2 + 20 // 4  # steps 20-39 in pairs, 40-59 in fours


def test_events_are_bucketed_apart_and_the_report_counts_the_folded_steps():
    series = LightSeries(full=2)
    sent = []
    for step in range(4, 8):  # buckets of 2 from step 4
        sent += series.offer(_sample(step, 10 * step, "forward_start"))
        sent += series.offer(_sample(step, 5, "optimizer_start"))
    sent += series.flush()
    assert sorted((s.event, s.step, s.steps_covered) for s in sent) == [
        ("forward_start", 5, 2), ("forward_start", 7, 2), ("optimizer_start", 4, 2), ("optimizer_start", 6, 2)]
    live = LiveState()
    for sample in sent:
        live.add(sample)
    memory = build_report(live.snapshot())["memory"]
    assert memory["light_steps_folded"] == 4
    assert sorted(p["steps_covered"] for p in memory["timeline"]) == [2, 2, 2, 2]


def test_the_memory_probe_folds_its_light_samples_and_sends_the_last_bucket_at_close():
    """Through the agent: with the series' threshold at 2 light steps, a 14-step run's light samples
    from step 4 on come in buckets, and the bucket under way at the end is sent when the agent closes."""
    import torch

    from advisor.agent.agent import Agent
    from advisor.agent.hooks import install
    from advisor.agent.probe_registry import build_probes
    from advisor.records.settings import AgentSettings

    settings = AgentSettings(probes=("memory",), deep_steps=(1,), deep_every=0)
    probes, _ = build_probes(settings)
    [memory] = probes
    memory._series = LightSeries(full=2)
    emitted = Emitted()
    agent = Agent(emit=emitted.append, settings=settings, probes=probes)
    hooks = install(agent)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(14):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        agent.flush(sync=True)
    finally:
        hooks.remove()
        agent.close()
    light = [r for r in emitted if isinstance(r, MemorySample) and r.event == "optimizer_start" and r.step != 1]
    early = [s for s in light if s.step < 4]
    assert [s.step for s in early] == [0, 2, 3] and all(s.steps_covered == 1 for s in early)
    later = [s for s in light if s.step >= 4]
    assert sum(s.steps_covered for s in later) == 14 - 4  # steps 4-13, each stood for once
    assert len(later) < 14 - 4 and max(s.steps_covered for s in later) == 4
