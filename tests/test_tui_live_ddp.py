"""The TUI over a live 2-rank examples/ddp.py: the slowest rank by default, rank switching, and
an apply from the Advice view measured on the running job."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from textual.message import Message
from textual.widgets import DataTable

from advisor.advice import AdviceLoop
from advisor.live_source import SessionSource
from advisor.records.settings import AgentSettings, probe_names
from advisor.controller import AttachOptions, Session
from advisor.tui import make_app
from advisor.tui.confirm_screen import ConfirmApplyScreen
from advisor.tui.messages import RankSwitched
from advisor.tui.quit_screen import QuitScreen
from advisor.tui.results import RESULT_STOP_TRAINING
from advisor.tui.views.overview import OverviewView

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_live_ddp_switches_ranks_and_applies(tmp_path) -> None:
    session = Session(AttachOptions(
        script=str(ROOT / "examples" / "ddp.py"), nproc_per_node=2, capture_output=True,
        args=["--steps", "1000000", "--device", "cpu"],
        # allow_inexact: as `--allow-inexact`, so that DDP's gradient-compression hook can be installed
        # (a live-opt-in remedy: the TUI still asks before applying it).
        settings=AgentSettings(probes=tuple(probe_names("all")), deep_steps=(1, 2, 3), deep_every=0,
                               allow_inexact=True)))
    advice = AdviceLoop(session, budget_bytes=None)
    session.add_listener(advice.on_record)
    session.start()
    app = make_app(SessionSource(session, advice), poll_interval=0.1)
    messages: list[Message] = []

    # One budget for the whole scenario, well inside the test's timeout, so that a stuck step fails
    # with the state it was stuck in rather than with pytest-timeout's stack dump.
    budget_end = time.monotonic() + 600.0

    def stuck(state) -> str:
        """What a timed-out wait says: the advice in hand and what it was made from."""
        deep = sorted({s.index for samples in state.steps.values() for s in samples if s.deep})
        return (f"timed out at step {state.latest_step()}: {[(r.id, r.live) for r in state.recommendations]}; "
                f"diagnosis {state.diagnosis}; advice error {advice.last_error}; "
                f"events {sorted({e.name for e in state.events})}; deep steps {deep}")

    async def wait(pilot, condition, timeout: float = 400.0) -> None:
        deadline = min(time.monotonic() + timeout, budget_end)
        while not condition():
            state = session.live.snapshot()
            assert time.monotonic() < deadline, stuck(state)
            assert session.poll() is None, "training died"
            await pilot.pause(0.1)

    def live_recs() -> list[str]:
        return [r.id for r in session.live.snapshot().recommendations if r.live]

    async def scenario() -> None:
        async with app.run_test(size=(140, 45), message_hook=messages.append) as pilot:
            await wait(pilot, lambda: session.live.snapshot().latest_step() >= 8 and advice.wait_idle(0)
                       and live_recs())
            await wait(pilot, lambda: app.model is not None and len(app.model.ranks) == 2)
            model = app.model
            assert model.rank == model.slowest_rank  # the slowest rank by default, whichever it is
            assert f"showing rank {model.rank}, the slowest" in app.query_one(OverviewView).plain
            # `]` pins the next rank: which one depends on the slowest at that instant (two equal
            # ranks trade places), the one after it does not.
            await pilot.press("5", "right_square_bracket")
            await wait(pilot, lambda: [m for m in messages if isinstance(m, RankSwitched)])
            pinned = [m for m in messages if isinstance(m, RankSwitched)][-1].rank
            await wait(pilot, lambda: app.model.rank == pinned)
            await pilot.press("right_square_bracket")
            await wait(pilot, lambda: app.model.rank == 1 - pinned)
            assert [m.rank for m in messages if isinstance(m, RankSwitched)] == [pinned, 1 - pinned]
            assert f"showing rank {1 - pinned}" in app.query_one(OverviewView).plain
            assert "shown" in str(app.query_one("#ranks-table", DataTable).get_row_at(1 - pinned)[6])
            # Apply the first live recommendation from the Advice view.
            await pilot.press("6")
            # The advice is recomputed as the job runs: the target is a live one the view lists now,
            # and the cursor walks to it with the keys (bounded: the list may change under it).
            rec_id = ""
            for _ in range(50):
                await wait(pilot, lambda: app.recs_view.selected is not None
                           and any(r.live for r in app.recs_view.recommendations))
                shown = [r.id for r in app.recs_view.recommendations]
                rec_id = rec_id if rec_id in shown else next(r.id for r in app.recs_view.recommendations if r.live)
                at = shown.index(app.recs_view.selected.id)
                if at == shown.index(rec_id):
                    break
                await pilot.press("down" if at < shown.index(rec_id) else "up")
            assert app.recs_view.selected.id == rec_id
            await pilot.press("a")
            if isinstance(app.screen, ConfirmApplyScreen):  # live-opt-in: it changes numerics
                await pilot.press("y")
            await wait(pilot, lambda: session.live.snapshot().applied)
            result = session.live.snapshot().applied[-1]
            assert result.recommendation_id == rec_id and result.status in ("kept", "reverted"), result
            await wait(pilot, lambda: result.status in app.result_view.plain)
            await pilot.press("q")
            assert isinstance(app.screen, QuitScreen)
            await pilot.press("s")

    try:
        asyncio.run(scenario())
    finally:
        # What `advisor attach` does with the answer "stop the training": SIGTERM to the job.
        session.terminate(grace=60)
        code, reason = session.finish(session.wait())
        advice.close()
        session.close()
    assert app.return_value == RESULT_STOP_TRAINING
    # Both ranks stopped by the SIGTERM (128 + 15), neither broken by the apply before it.
    assert code == 143 and "SIGTERM" in reason, reason
