"""The TUI's numbers: advice held while a remedy is measured; results with their windows; exits."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
from textual.widgets import DataTable
from tui_fakes import FakeSource, applied, recommendation

from advisor.records.advice import Diagnosis
from advisor.records.results import ApplyStarted, Measurement, RevertResult
from advisor.state import SessionState
from advisor.tui import make_app
from advisor.tui.exit_banner import exit_text
from advisor.tui.result_view import result_text

pytestmark = pytest.mark.timeout(20)
POLL = 0.02


def test_advice_does_not_flip_while_a_remedy_is_measured() -> None:
    source = FakeSource()
    app = make_app(source, title="t", poll_interval=POLL)

    async def until(pilot, condition) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 5
        while not condition():
            assert time.monotonic() < deadline, "condition not met in time"
            await pilot.pause(POLL)

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            source.add_steps(3)
            source.advise([recommendation("ac-1")])
            await until(pilot, lambda: len(app.recs_view.recommendations) == 1)
            source.live.add(ApplyStarted(remedy="activation_checkpointing", recommendation_id="ac-1",
                                         at_step=3).event(step=3))
            # Half-measured steps make the advice loop say something else: the view holds.
            source.advise([recommendation("none-1", title="No built remedy fits", live=False)],
                          Diagnosis(bottleneck="none", summary="no bottleneck"))
            await until(pilot, lambda: "advice is held" in app.recs_view.diagnosis_plain)
            assert "Bottleneck: memory" in app.recs_view.diagnosis_plain
            assert [r.id for r in app.recs_view.recommendations] == ["ac-1"]
            source.finish_apply(applied("ac-1", at_step=3))
            await until(pilot, lambda: [r.id for r in app.recs_view.recommendations] == ["none-1"])
            assert "advice is held" not in app.recs_view.diagnosis_plain
            assert app.recs_view.query_one(DataTable).row_count == 1

    asyncio.run(main())


def test_result_shows_the_known_before_and_the_windows() -> None:
    state = SessionState()
    before = Measurement(peak_memory_bytes=34407204, step_time_s=0.08, steps=(2, 3, 4))
    state.events = [ApplyStarted(remedy="activation_checkpointing", recommendation_id="ac-1", at_step=5,
                                 before=before).event(step=5)]
    result = replace(applied("ac-1", at_step=5), before=Measurement(),
                     after=Measurement(peak_memory_bytes=20679456, step_time_s=0.09, steps=(5, 6, 7)))
    state.applied = [result]
    text = str(result_text(state, None, None))
    assert "measured on steps 2-4 → steps 5-7" in text
    assert "32.8 MiB → 19.7 MiB" in text


def test_a_revert_on_request_says_what_it_did() -> None:
    state = SessionState()
    state.applied = [RevertResult(remedy="activation_checkpointing", recommendation_id="ac-1", at_step=9)]
    text = str(result_text(state, None, None))
    assert "reverted on request" in text and "measured —" not in text


def test_no_exit_recorded_is_said_plainly() -> None:
    state = SessionState(finished=True, exit_code=None, exit_reason="")
    text = str(exit_text(state))
    assert "no exit recorded" in text and "None" not in text
