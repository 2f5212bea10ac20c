"""Pure communication analysis: nccl-tests formulas, exposure, matching, report sections."""

from __future__ import annotations

import random

import pytest
from rich.console import Console

from advisor.sections.comm import (
    build_collectives_section,
    build_comm_section,
    build_straggler_section,
    render_comm_sections,
)
from advisor.state import SessionState
from advisor.records.comm_cache import bench_busbw, load_cache, save_result
from advisor.records.samples import CollectiveStat, Event, StepSample
from advisor.records.bandwidth import algbw, bus_factor, busbw
from advisor.records.intervals import exposed_s, merge_intervals, subtract_intervals
from advisor.recommend.comm import Arrival, match_calls, straggler


def test_bus_bandwidth_hand_computed():
    # 1 GB all-reduced in 0.1 s on 8 ranks: algbw 10 GB/s, busbw 10 * 2*7/8 = 17.5 GB/s
    assert algbw(1e9, 0.1) == pytest.approx(10e9)
    assert busbw("all_reduce", 1e9, 0.1, 8) == pytest.approx(17.5e9)
    # all-gather and reduce-scatter on 4 ranks: x 3/4
    assert busbw("all_gather", 4e9, 1.0, 4) == pytest.approx(3e9)
    assert busbw("reduce_scatter", 4e9, 2.0, 4) == pytest.approx(1.5e9)
    assert busbw("broadcast", 2e9, 1.0, 16) == pytest.approx(2e9)
    assert busbw("send", 2e9, 1.0, 2) == pytest.approx(2e9)
    assert bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert algbw(1.0, 0.0) is None
    with pytest.raises(ValueError, match="valid"):
        bus_factor("allreduce", 2)


def test_intervals_and_exposure():
    assert merge_intervals([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert subtract_intervals([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    compute = [(0.0, 1.0), (2.0, 3.0)]
    assert exposed_s((0.5, 2.5), compute) == pytest.approx(1.0)  # 1.0..2.0 uncovered
    assert exposed_s((0.2, 0.8), compute) == 0.0  # fully overlapped
    assert exposed_s((4.0, 5.0), compute) == pytest.approx(1.0)  # nothing to hide behind
    rng = random.Random(0)
    for _ in range(500):
        a = rng.uniform(0, 10)
        call = (a, a + rng.uniform(0, 3))
        comp = [(x, x + rng.uniform(0, 2)) for x in (rng.uniform(0, 12) for _ in range(5))]
        assert 0.0 <= exposed_s(call, comp) <= call[1] - call[0] + 1e-12


def test_matching_names_the_latest_rank():
    arrivals = []
    for seq in range(3):
        for rank, delay in ((0, 0.0), (1, 0.2), (2, 0.05)):
            arrivals.append(Arrival(rank=rank, step=seq, op="all_reduce", group="g", seq=seq, start=100 + seq + delay, time_s=0.3))
    arrivals.append(Arrival(rank=0, step=9, op="all_reduce", group="g", seq=99, start=1.0, time_s=0.1))  # unmatched
    matched = match_calls(arrivals)
    assert len(matched) == 3
    assert all(m.latest_rank == 1 for m in matched)
    assert matched[0].waits[0] == pytest.approx(0.2) and matched[0].waits[1] == 0.0
    report = straggler(matched)
    assert report is not None and report.rank == 1
    # others' mean wait per call: (0.2 + 0.15) / 2, over 3 calls
    assert report.wait_caused_s[1] == pytest.approx(3 * 0.175)
    assert report.skew_s == pytest.approx(0.2)
    assert straggler([]) is None


def _state(delay: float) -> SessionState:
    state = SessionState()
    for rank in (0, 1):
        state.steps[rank] = []
        rows = []
        for step in range(3):
            begin = 1000.0 + step
            start = begin + 0.5 + (delay if rank == 1 else 0.0)
            end = begin + 0.5 + delay + 0.1  # both finish together
            state.collectives.append(
                CollectiveStat(rank=rank, step=step, op="all_reduce", group_size=2, bytes=4_000_000,
                               dtype="float32", start=start, time_s=end - start, exposed_s=(end - start) / 2)
            )
            rows.append({"op": "all_reduce", "group": "0", "seq": step, "start": start})
            state.steps[rank].append(StepSample(index=step, rank=rank, end_time=begin + 0.9, time_s=0.9))
        state.events.append(Event(rank=rank, step=0, name="collective_seq", data={"calls": rows}))
    return state


def test_sections_on_recorded_state():
    state = _state(delay=0.2)
    rows = build_collectives_section(state)
    assert [(r["rank"], r["op"], r["count"], r["bytes"]) for r in rows] == [(0, "all_reduce", 3, 4_000_000), (1, "all_reduce", 3, 4_000_000)]
    r0, r1 = rows
    assert r0["wait_s"] == pytest.approx(0.6) and r1["wait_s"] == pytest.approx(0.0)
    # bandwidth from the transfer (0.1 s per call) on both ranks, not rank 0's 0.3 s
    assert r0["algbw"] == pytest.approx(4e7) and r1["algbw"] == pytest.approx(4e7)
    assert r0["busbw"] == pytest.approx(4e7)  # x 2(n-1)/n = 1 for n = 2
    assert all(r["exposed_s"] <= r["time_s"] for r in rows)
    comm = build_comm_section(state)
    assert comm[0]["comm_s"] == pytest.approx(0.3) and comm[1]["comm_s"] == pytest.approx(0.1)
    assert comm[0]["exposed_share"] == pytest.approx(0.15 / 0.9)
    s = build_straggler_section(state)
    assert s is not None and s["rank"] == 1
    assert s["wait_caused_s"] == pytest.approx(0.6) and s["wait_caused_per_step_s"] == pytest.approx(0.2)
    assert s["per_rank_step_time_s"] == {"0": pytest.approx(0.9), "1": pytest.approx(0.9)}
    console = Console(record=True, width=160)
    for renderable in render_comm_sections(rows, comm, s):
        console.print(renderable)
    text = console.export_text()
    assert "Straggler: rank 1" in text and "all_reduce" in text


def test_no_collectives_gives_empty_sections():
    state = SessionState()
    assert build_collectives_section(state) == []
    assert build_comm_section(state) == []
    assert build_straggler_section(state) is None
    assert render_comm_sections([], [], None) == []


def test_bench_cache_feeds_report(tmp_path):
    path = tmp_path / "c.json"
    rows = [{"op": "all_reduce", "bytes": 4096, "busbw": 1e8}, {"op": "all_reduce", "bytes": 4 << 20, "busbw": 5e9}]
    save_result("h|gloo|cpu|2", {"world_size": 2, "results": rows}, path)
    cache = load_cache(path)
    assert bench_busbw(cache, op="all_reduce", nbytes=3 << 20, world_size=2) == 5e9
    assert bench_busbw(cache, op="all_reduce", nbytes=5000, world_size=2) == 1e8
    assert bench_busbw(cache, op="all_gather", nbytes=5000, world_size=2) is None
    assert bench_busbw(cache, op="all_reduce", nbytes=5000, world_size=4) is None
    path.write_text("not json")
    assert load_cache(path) == {}


def test_report_shows_cached_bench(monkeypatch, tmp_path):
    from advisor.records.comm_cache import cache_path

    save_result("h|gloo|cpu|2", {"world_size": 2, "results": [{"op": "all_reduce", "bytes": 4_000_000, "busbw": 7e9}]})
    assert cache_path().exists()
    rows = build_collectives_section(_state(delay=0.0))
    assert all(r["bench_busbw"] == 7e9 for r in rows)
