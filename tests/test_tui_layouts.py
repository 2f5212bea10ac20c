"""What a person reads at 80x24 and 120x40, per view: the key figures are on screen, whole; the
footer shows the apply key; a table too wide says what it hides and how to see it."""

from __future__ import annotations

import re

import pytest
from recorded import load_state
from textual.pilot import Pilot
from tui_recorded import open_recorded, settle
from tui_screen import cut_figures, footer_line, screen_text

from advisor.report import build_report
from advisor.tui.app import VIEWS, AdvisorApp
from advisor.tui.fit_table import FullTableScreen

pytestmark = pytest.mark.timeout(120)
SIZES = [(80, 24), (120, 40)]
IDS = ["80x24", "120x40"]
LAST_LINE = "step 29 loss 0.8489"


def _with_output(state):  # the recorded run, as if it ran under the TUI: its output in the state
    state.output_tail = [f"step {i} loss {1 / (i + 1):.4f}" for i in range(29)] + [LAST_LINE]
    state.output_lines = len(state.output_tail)
    return state


def _open(size: tuple[int, int], scenario):
    return open_recorded("ddp", scenario, size=size, prepare=_with_output)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_every_view_shows_its_key_figures_whole_and_the_apply_key(size: tuple[int, int]) -> None:
    report = build_report(load_state("ddp"))
    ids = [r["id"] for r in report["recommendations"]]
    assert ids  # the report advises this session: the Advice view must list the same

    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> dict[str, str]:
        screens: dict[str, str] = {}
        for key, tab, _ in VIEWS:
            await pilot.press(key)
            await settle(app, pilot)
            screens[tab] = screen_text(app)
            footer = footer_line(app)
            assert "a Apply" in footer and "q Quit" in footer, (tab, footer)  # greyed here, but shown
            assert cut_figures(app) == [], tab
        return screens

    _, _, screens = _open(size, scenario)
    assert "Bottleneck: communication" in screens["overview"]
    assert f"output {LAST_LINE}" in screens["overview"]  # the script's last line
    assert "peak 10.8 MiB at step 1" in screens["memory"]
    # The chart, or at 80x24 its table: the traced step's own peak, whole (the total row included).
    assert re.search(r"peak 10\.8 MiB at [0-9.]+ ms|total\s+10\.8 MiB", screens["memory"])
    assert "MFU 6.1%" in screens["compute"]
    assert "straggler rank 0:" in screens["comm"]
    assert "10.8 MiB" in screens["ranks"] and "slowest, shown" in screens["ranks"]
    for rec_id in ids:
        assert rec_id in screens["advice"], rec_id
    assert "completed (exit code 0)" in screens["events"]
    assert LAST_LINE in screens["output"]
    # The exit banner names the script's last line too, in either size.
    assert LAST_LINE in screens["advice"]


def test_at_80_columns_a_table_too_wide_says_what_it_hides_and_f_shows_it() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> None:
        await pilot.press("6")
        await settle(app, pilot)
        text = screen_text(app)
        assert "hidden at this width: conf · f shows all columns" in text
        header = next(line for line in text.splitlines() if "#  recommendation" in line)
        assert "step time" in header and "peak memory" in header and "conf" not in header
        await pilot.press("f")
        await settle(app, pilot)
        assert isinstance(app.screen, FullTableScreen)
        full = app.screen.query_one("#full-table")
        assert [str(c.label) for c in full.columns.values()] == ["#", "recommendation", "step time", "peak memory",
                                                                 "class", "conf"]
        await pilot.press("escape")
        assert not isinstance(app.screen, FullTableScreen)

    _open((80, 24), scenario)


def test_the_memory_chart_is_of_the_traced_step_in_ms_with_a_legend_under_it() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> str:
        await pilot.press("2")
        await settle(app, pilot)
        return screen_text(app)

    _, _, text = _open((120, 40), scenario)
    assert "memory by category, step 1 (traced by the memory probe, rank 1): peak 10.8 MiB" in text
    assert "ms from the start of step 1" in text and "MiB" in text
    lines = text.splitlines()
    legend = next(i for i, line in enumerate(lines) if "■ parameter" in line)
    axis = next(i for i, line in enumerate(lines) if "ms from the start of step 1" in line)
    assert legend > axis  # under the plot, never over its data
