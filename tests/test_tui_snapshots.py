"""SVG snapshots of every view at 120x40 and 80x24 on a recorded 2-rank session (tests/data/ddp)."""

from __future__ import annotations

import pytest
from textual.pilot import Pilot
from tui_recorded import open_recorded, settle
from tui_snapshots import check_snapshot

from advisor.tui.app import VIEWS, AdvisorApp

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
def test_every_view_matches_its_snapshot(size: tuple[int, int], tmp_path) -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], messages: list) -> dict[str, str]:
        shots = {}
        for key, tab, _ in VIEWS:
            await pilot.press(key)
            await settle(app, pilot)
            shots[tab] = app.export_screenshot()
        return shots

    _, _, shots = open_recorded("ddp", scenario, size=size)
    failures = []
    for tab, svg in shots.items():
        try:
            check_snapshot(f"ddp-{tab}-{size[0]}x{size[1]}", svg, tmp_path)
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(failures)
