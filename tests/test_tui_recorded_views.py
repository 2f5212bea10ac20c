"""Each view driven through Pilot on recorded sessions (tests/data): the figures it shows."""

from __future__ import annotations

import json

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static, TabbedContent
from tui_recorded import open_recorded, settle, until

from advisor.tui.app import AdvisorApp
from advisor.tui.chart import Chart
from advisor.tui.messages import AdviceRecomputed, ApplyRefused, PlanWritten, RankSwitched
from advisor.tui.views.comm import CommView
from advisor.tui.views.compute import ComputeView
from advisor.tui.views.memory import MemoryView
from advisor.tui.views.overview import OverviewView

pytestmark = pytest.mark.timeout(60)


def rows(app: AdvisorApp, table_id: str) -> list[list[str]]:
    table = app.query_one(f"#{table_id}", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def test_ddp_overview_memory_compute_comm_show_the_slowest_rank() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> None:
        overview = app.query_one(OverviewView).plain
        assert "Bottleneck: communication: exposed communication takes 35% of the step" in overview
        # medians of the ordinary steps (not right after a deep one): 14.70 ms against 14.65 ms
        assert "ranks 2 (showing rank 1, the slowest)" in overview
        assert app.query_one("#phases-chart", Chart).plotted  # 120x40: room for the plot
        await pilot.press("2")
        assert app.query_one(TabbedContent).active == "memory"
        memory = app.query_one(MemoryView).summary_plain
        assert "peak 10.8 MiB at step 1" in memory
        assert "at the peak   optimizer_state 4.10 MiB   temporary 2.55 MiB   parameter 2.05 MiB" in memory
        modules = rows(app, "modules-table")
        assert modules[0][:2] == ["layers.0.act", "64.0 KiB"]  # sorted by activation bytes
        await pilot.press("s")  # next sort key: input bytes
        assert app.query_one(MemoryView).sort_key == "input_bytes"
        await pilot.press("3")
        compute = app.query_one(ComputeView).summary_plain
        assert "MFU 6.1%" in compute and "memory-bound share 25%" in compute and "ridge 11.7 FLOP/B" in compute
        top = rows(app, "ops-table")[0]
        assert top[0] == "aten.sqrt" and top[3] == "memory" and top[6] == "optimizer"
        await pilot.press("4")
        comm = app.query_one(CommView).summary_plain
        assert "straggler rank 0:   the others wait 12.9 ms per step for it" in comm
        # medians of each rank's ordinary steps, as the report's comm section and the diagnosis
        assert "rank 1:   step 14.7 ms   comm 10.3 ms   exposed 8.94 ms (61%)" in comm
        assert rows(app, "collectives-table")[0][:5] == ["all_reduce", "59", "61.5 MiB", "585 ms", "454 ms"]

    open_recorded("ddp", scenario)


def test_selecting_a_rank_switches_every_view() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> None:
        await pilot.press("5")
        ranks = rows(app, "ranks-table")
        assert [r[0] for r in ranks] == ["0", "1"] and ranks[1][6] == "slowest, shown"
        await pilot.press("up", "enter")  # rank 0's row
        await until(pilot, lambda: app.model is not None and app.model.rank == 0)
        await settle(app, pilot)
        assert [m.rank for m in messages if isinstance(m, RankSwitched)] == [0]
        assert rows(app, "ranks-table")[0][6] == "shown"
        assert "showing rank 0)" in app.query_one(OverviewView).plain
        assert rows(app, "collectives-table")[0][:2] == ["all_reduce", "59"]
        assert "rank 0 shown" in app.sub_title
        await pilot.press("right_square_bracket")  # on to rank 1 from anywhere
        await until(pilot, lambda: app.model is not None and app.model.rank == 1)

    open_recorded("ddp", scenario)


def test_oom_session_memory_events_advice_budget_and_plan(tmp_path) -> None:
    plan = tmp_path / "plan.json"

    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> None:
        await pilot.press("2")
        memory = app.query_one(MemoryView).summary_plain
        assert "peak 22.1 MiB at step 0 of a 22.9 MiB budget (97%)" in memory
        assert "OUT OF MEMORY on rank 0 at step 0 in aten.nll_loss_backward" in memory
        await pilot.press("7")
        events = rows(app, "events-table")
        assert [e[2] for e in events] == ["exit", "oom"]  # newest first
        assert events[1][3].startswith("out of memory in aten.nll_loss_backward")
        await pilot.press("6")
        recs = rows(app, "recs-table")
        assert [(r[1], r[4]) for r in recs] == [("checkpoint-blocks-4  Checkpoint 4 blocks module(s)",
                                                 "live-exact")]
        assert app.query_one("#curve-chart", Chart).plotted
        await pilot.press("a")  # read-only: the key is greyed and does nothing
        assert not [m for m in messages if isinstance(m, ApplyRefused)]
        # Recompute at a roomy budget: the job fits, nothing to recommend.
        await pilot.press("b")
        await pilot.press("ctrl+a", "ctrl+k", *"1GiB", "enter")
        await until(pilot, lambda: len([m for m in messages if isinstance(m, AdviceRecomputed)]) == 2)
        await until(pilot, lambda: app.model is not None and app.model.budget_bytes == 1024**3)
        await settle(app, pilot)
        assert rows(app, "recs-table") == []
        # Back to the recorded budget, then write the recommendation to a plan.
        await pilot.press("b", "ctrl+a", "ctrl+k", *"24000000", "enter")
        await until(pilot, lambda: len(rows(app, "recs-table")) == 1)
        await pilot.press("p", "ctrl+a", "ctrl+k", *str(plan), "enter")
        await until(pilot, lambda: any(isinstance(m, PlanWritten) for m in messages))
        written = [m for m in messages if isinstance(m, PlanWritten)][0]
        assert written.error is None and written.recommendation_id == "checkpoint-blocks-4"

    open_recorded("oom", scenario)
    data = json.loads(plan.read_text())
    assert [r["remedy"] for r in data["remedies"]] == ["activation_checkpointing"]


def test_charts_become_tables_when_the_terminal_is_small() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> None:
        await pilot.press("2")
        chart = app.query_one("#memory-chart", Chart)
        assert not chart.plotted
        assert "optimizer_state" in chart.table_plain and "total" in chart.table_plain

    open_recorded("ddp", scenario, size=(80, 24))


def test_events_view_lists_rank_exits_and_output_says_where_it_went() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> None:
        await pilot.press("7")
        events = rows(app, "events-table")
        assert sorted((e[1], e[2], e[3]) for e in events) == [("0", "exit", "completed (exit code 0)"),
                                                              ("1", "exit", "completed (exit code 0)")]
        await pilot.press("8")
        # Recorded headless: its output went to the terminal it ran in, and the view says so.
        assert "no output recorded for this session" in str(app.query_one("#output-where", Static).content)

    open_recorded("ddp", scenario)
