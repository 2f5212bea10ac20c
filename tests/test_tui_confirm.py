"""A live-opt-in remedy (it changes numerics) is applied from the TUI only after the user says yes."""

from __future__ import annotations

import pytest
from test_tui_app import of, run, until
from textual.message import Message
from textual.pilot import Pilot
from tui_fakes import FakeSource, recommendation

from advisor.tui.app import AdvisorApp
from advisor.records.advice import Recommendation
from advisor.tui.confirm_screen import ConfirmApplyScreen
from advisor.tui.messages import ApplySent

pytestmark = pytest.mark.timeout(10)


def _opt_in(rec_id: str) -> Recommendation:
    return recommendation(rec_id, title="Lower precision", exact=False, apply_class="live-opt-in")


def test_no_cancels_and_yes_applies_with_the_confirmation() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.add_steps(3)
        source.advise([_opt_in("bf16")])
        await until(pilot, lambda: app.recs_view.selected is not None)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmApplyScreen))
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmApplyScreen))
        assert source.calls == [] and not of(messages, ApplySent)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmApplyScreen))
        await pilot.press("y")
        await until(pilot, lambda: of(messages, ApplySent))
        assert source.calls == [("apply", "bf16", "confirmed")]

    run(scenario)


def test_an_exact_remedy_asks_nothing() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.add_steps(3)
        source.advise([recommendation("ac-1", apply_class="live-exact")])
        await until(pilot, lambda: app.recs_view.selected is not None)
        await pilot.press("a")
        await until(pilot, lambda: of(messages, ApplySent))
        assert source.calls == [("apply", "ac-1")]

    run(scenario)
