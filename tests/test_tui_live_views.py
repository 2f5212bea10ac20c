"""A live two-rank job through Pilot (FakeSource): the script's output as it arrives, the rank every
panel shows, the step the Memory chart draws, and what the views say once a remedy is kept."""

from __future__ import annotations

import asyncio

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable
from tui_fakes import FakeSource, applied
from tui_screen import cut_figures, footer_line, screen_text

from advisor.records.samples import Event, MemorySample, RunInfo, StepSample
from advisor.tui import make_app
from advisor.tui.app import AdvisorApp
from advisor.tui.fit_table import FitTable

pytestmark = pytest.mark.timeout(60)
POLL = 0.02
MIB = 1024**2
BUDGET = 24 * MIB


def run(scenario, source: FakeSource, size: tuple[int, int]) -> None:
    app = make_app(source, title="advisor", poll_interval=POLL)
    app.animation_level = "none"
    messages: list = []

    async def main() -> None:
        async with app.run_test(size=size, message_hook=messages.append) as pilot:
            await scenario(app, pilot, messages)

    asyncio.run(main())


async def until(pilot: Pilot[str], condition, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await pilot.pause(POLL)


async def settled(app: AdvisorApp, pilot: Pilot[str]) -> None:
    """Wait until a model is built and no build is running (the views read the newest state)."""
    await until(pilot, lambda: app.model is not None)
    for _ in range(2):
        await until(pilot, lambda: not any(w.is_running for w in app.workers))
        await pilot.pause(POLL * 3)


def _memory(rank: int, step: int, peak: int, samples: int) -> list[MemorySample]:
    """A step's samples rising to ``peak`` halfway (10 ms apart), as the memory probe traces one."""
    out = []
    for i in range(samples):
        total = peak if i == samples // 2 else peak // 2
        out.append(MemorySample(rank=rank, step=step, time=0.01 * i, event="op",
                                categories={"parameter": total // 2, "activation": total - total // 2},
                                total_bytes=total))
    return out


def two_ranks(source: FakeSource, *, kept: bool) -> None:
    """Steps 0-9 on two ranks (rank 1 slower); the memory probe traced step 1 (and step 7 after a
    kept remedy at step 6), the compute probe step 3 with one boundary sample."""
    live = source.live
    for rank in (0, 1):
        live.add(RunInfo(script="train.py", argv=[], rank=rank, world_size=2,
                         config={"memory_budget_bytes": BUDGET}))
        for index in range(10):
            probes = {1: ["memory", "comm"], 3: ["compute"], 7: ["memory"] if kept else []}.get(index, [])
            live.add(StepSample(index=index, rank=rank, time_s=0.1 + 0.1 * rank + 0.001 * index, deep=bool(probes),
                                deep_probes=probes, loss=1.0 / (index + 1),
                                phases={"forward_s": 0.05, "backward_s": 0.05 + 0.1 * rank + 0.001 * index}))
        for sample in _memory(rank, 1, 32 * MIB, 50) + _memory(rank, 3, 7 * MIB, 1):
            live.add(sample)
        if kept:
            for sample in _memory(rank, 7, 9 * MIB, 50):
                live.add(sample)
    if kept:
        for rank in (0, 1):
            live.add(Event(rank=rank, step=6, name="apply_started",
                           data={"remedy": "activation_checkpointing", "recommendation_id": "ac-1", "at_step": 6}))
            live.add(applied("ac-1", status="kept", at_step=6).with_(rank=rank).event(rank=rank, step=9))


def test_the_scripts_output_streams_into_its_view_at_80x24_with_the_apply_key_on_the_footer() -> None:
    source = FakeSource()
    source.add_steps(3)

    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> None:
        for i in range(3):
            source.live.append_output(f"step {i} loss {2.0 / (i + 1)!r}")
        await pilot.press("8")
        await until(pilot, lambda: "step 2 loss 0.6666666666666666" in screen_text(app))
        assert "a Apply" in footer_line(app)
        for i in range(3, 60):  # more than the view's height: it follows the newest line
            source.live.append_output(f"step {i} loss {2.0 / (i + 1)!r}")
        await until(pilot, lambda: "step 59 loss 0.03333333333333333" in screen_text(app))
        text = screen_text(app)
        assert "60 lines" in text and "step 3 loss" not in text  # scrolled to the end
        model = app.model
        await pilot.press("1")
        await until(pilot, lambda: "output step 59 loss 0.03333333333333333" in screen_text(app))
        assert "a Apply" in footer_line(app)
        assert app.model is model  # lines of output redraw, and rebuild no model

    run(scenario, source, (80, 24))


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_every_panel_follows_the_rank_chosen_with_brackets(size: tuple[int, int]) -> None:
    source = FakeSource()
    two_ranks(source, kept=False)

    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> None:
        await settled(app, pilot)
        assert app.model.rank == 1  # the slowest by default
        assert "Steps (rank 1 of 2)" in screen_text(app)
        first = [str(c) for c in app.steps_view.query_one(DataTable).get_row_at(0)]
        assert first[:2] == ["9", "209 ms"]  # rank 1's step 9
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: app.model is not None and app.model.rank == 0)
        await pilot.pause(POLL * 3)
        text = screen_text(app)
        assert "Steps (rank 0 of 2)" in text and "showing rank 0" in text
        assert [str(c) for c in app.steps_view.query_one(DataTable).get_row_at(0)][:2] == ["9", "109 ms"]
        assert cut_figures(app) == []

    run(scenario, source, size)


def test_the_memory_chart_draws_the_step_the_memory_probe_traced_not_the_latest_deep_step() -> None:
    source = FakeSource()
    two_ranks(source, kept=False)

    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> None:
        await settled(app, pilot)
        await pilot.press("2")
        await pilot.pause(POLL * 3)
        traced = app.model.traced
        assert traced is not None and traced.step == 1 and traced.samples == 50  # step 3 had one sample
        text = screen_text(app)
        assert "memory by category, step 1 (traced by the memory probe, rank 1): peak 32.0 MiB at 250.0 ms" in text
        assert "ms from the start of step 1" in text
        assert "peak 32.0 MiB at step 1 of a 24.0 MiB budget (133%)" in text

    run(scenario, source, (120, 40))


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_after_a_kept_remedy_every_view_describes_the_job_as_it_is_now(size: tuple[int, int]) -> None:
    source = FakeSource()
    two_ranks(source, kept=True)

    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> dict[str, str]:
        await settled(app, pilot)
        assert app.model.regime_since == 6
        screens = {}
        for key, name in (("1", "overview"), ("2", "memory"), ("5", "ranks"), ("6", "advice")):
            await pilot.press(key)
            await pilot.pause(POLL * 3)
            screens[name] = screen_text(app)
            assert cut_figures(app) == [], name
        memory = app.query_one("#memory-summary").plain
        assert "peak now 9.00 MiB at step 7 of a 24.0 MiB budget (38%)" in memory
        assert "whole run 32.0 MiB at step 1 (133%)" in memory
        # One remedy in force, named once though both ranks kept it.
        assert "remedies in force activation_checkpointing   job running" in app.query_one("#overview-facts").plain
        # One decision for both ranks, which the history and the result both name.
        history = app.query_one("#history-table", DataTable)
        assert history.row_count == 1 and "all 2 ranks" in [str(c) for c in history.get_row_at(0)]
        assert app.result_view.plain.count("✓ kept") == 1
        assert "from step 6 · all 2 ranks (rank 1's measurement)" in app.result_view.plain
        assert app.model.traced.step == 7  # the latest traced step: the job with its remedy
        ranks = [[str(c) for c in row] for row in app.query_one("#ranks-table", FitTable).full_rows]
        assert [row[3] for row in ranks] == ["9.00 MiB", "9.00 MiB"]  # the peak now, as the Memory view says
        assert "peak memory since step 6" in screens["ranks"]
        # Each regime of the report, on the Overview: before the remedy and after it.
        assert "before any remedy   steps 0-5   peak 32.0 MiB" in app.query_one("#overview-facts").plain
        assert "after activation_checkpointing   steps 6-9   peak 9.00 MiB" in app.query_one("#overview-facts").plain
        return screens

    run(scenario, source, size)
