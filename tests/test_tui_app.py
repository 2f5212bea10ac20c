"""The advisor app driven through Pilot over a FakeSource: steps, apply, revert, failure, exit."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
from textual.message import Message
from textual.pilot import Pilot
from textual.widgets import DataTable
from tui_fakes import FakeSource, applied, recommendation

from advisor.tui import make_app
from advisor.records.advice import CurvePoint
from advisor.tui.app import RESULT_FINISHED, RESULT_LEFT_RUNNING, RESULT_STOP_TRAINING, AdvisorApp, last_kept
from advisor.tui.quit_screen import QuitScreen
from advisor.tui.evidence_screen import EvidenceScreen
from advisor.tui.messages import (
    ApplyFinished,
    ApplyRefused,
    ApplyRequested,
    ApplySent,
    RevertRefused,
    RevertRequested,
    RevertSent,
    StateRefreshed,
    TrainingEnded,
)
from advisor.records.samples import ExitInfo, MemorySample

pytestmark = pytest.mark.timeout(10)

POLL = 0.02
Scenario = Callable[[AdvisorApp, Pilot[str], FakeSource, list[Message]], Awaitable[None]]


def run(scenario: Scenario, source: FakeSource | None = None) -> tuple[AdvisorApp, list[Message]]:
    """Run the app headless around ``scenario``; returns the app (for its return value) and messages."""
    source = source or FakeSource()
    app = make_app(source, title="advisor test", poll_interval=POLL)
    messages: list[Message] = []

    async def main() -> None:
        async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
            await scenario(app, pilot, source, messages)
            await app.workers.wait_for_complete()

    asyncio.run(main())
    return app, messages


async def until(pilot: Pilot[str], condition: Callable[[], object], timeout: float = 2.0) -> None:
    """Wait for a poll (or worker) to make ``condition`` true; fail with a clear message otherwise."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(POLL)


def of(messages: list[Message], kind: type[Message]) -> list[Message]:
    return [m for m in messages if isinstance(m, kind)]


def test_steps_arrive_and_table_shows_newest_first() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        assert "waiting for the first step" in app.steps_view.summary_text
        source.add_steps(5)
        await until(pilot, lambda: any(m.latest_step == 4 for m in of(messages, StateRefreshed)))
        table = app.steps_view.query_one(DataTable)
        assert table.row_count == 5
        newest = [str(c) for c in table.get_row_at(0)]
        assert newest[0] == "4" and newest[1] == "104 ms" and newest[-1] == "3.00 GiB"
        assert "step 4" in app.steps_view.summary_text
        assert "step time" in app.steps_view.summary_text and "loss" in app.steps_view.summary_text
        assert "step 4" in app.sub_title
        # No change, no redraw: polls keep running but post nothing new.
        count = len(of(messages, StateRefreshed))
        await pilot.pause(POLL * 5)
        assert len(of(messages, StateRefreshed)) == count

    run(scenario)


def test_diagnosis_and_ranked_recommendations_show_predictions() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.advise([recommendation("ac-1"), recommendation("mb-2", title="Halve the micro-batch", live=False)])
        await until(pilot, lambda: len(app.recs_view.recommendations) == 2)
        assert "Bottleneck: memory" in app.recs_view.diagnosis_plain
        assert "peak memory: 94 % (threshold 90 %)" in app.recs_view.diagnosis_plain
        table = app.recs_view.query_one(DataTable)
        first = [str(c) for c in table.get_row_at(0)]
        assert first[1] == "ac-1  Checkpoint 4 transformer blocks"  # the id, then the title
        assert first[2] == "120 ms (+20%)"
        assert first[3] == "2.00 GiB (-33%)"
        assert "Baseline: peak 3.00 GiB, 100 ms/step" in app.recs_view.diagnosis_plain
        assert first[4] == "live-exact" and first[5] == "high"
        assert str(table.get_row_at(1)[4]).startswith("restart")

    run(scenario)


def test_footer_lists_the_keys() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        shown = {b.binding.key: b.binding.description for b in app.active_bindings.values() if b.binding.show}
        # A live job: apply, revert, ranks, plan; the budget key belongs to recorded sessions (advisor open).
        # The views' keys are on their tabs ("1 Overview" ...), not in the footer, which has room for these.
        assert shown == {"enter": "Evidence", "a": "Apply", "r": "Revert", "left_square_bracket": "Rank-",
                         "right_square_bracket": "Rank+", "p": "Plan", "q": "Quit"}
        await pilot.press("6")  # the recommendations table: Enter still means Evidence there
        shown = {b.binding.key: b.binding.description for b in app.active_bindings.values() if b.binding.show}
        assert shown["enter"] == "Evidence"

    run(scenario)


def test_apply_shows_pending_then_predicted_vs_measured() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.add_steps(3)
        source.advise([recommendation("ac-1")])
        await until(pilot, lambda: app.recs_view.selected is not None)
        await pilot.press("a")
        await until(pilot, lambda: of(messages, ApplySent))
        assert source.calls == [("apply", "ac-1")]
        assert [m.recommendation_id for m in of(messages, ApplyRequested)] == ["ac-1"]
        assert of(messages, ApplySent)[0].error is None
        assert "applying Checkpoint 4 transformer blocks at next step boundary…" in app.result_view.plain
        # The agent reports back a few steps later.
        source.add_steps(2)
        source.finish_apply(applied("ac-1", status="kept"))
        await until(pilot, lambda: of(messages, ApplyFinished))
        finished = of(messages, ApplyFinished)[0]
        assert finished.recommendation_id == "ac-1" and finished.status == "kept"
        text = app.result_view.plain
        assert "applying" not in text
        assert "✓ kept  Checkpoint 4 transformer blocks from step 12" in text
        assert "predicted 2.00 GiB  measured 3.00 GiB → 2.10 GiB (-30%)" in text
        assert "predicted 120 ms  measured 100 ms → 125 ms (+25%)" in text
        status_cell = app.recs_view.query_one(DataTable).get_row_at(0)[6]
        assert str(status_cell) == "kept"

    run(scenario)


def test_pending_shown_while_source_apply_blocks() -> None:
    source = FakeSource()
    source.apply_gate = threading.Event()

    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.advise([recommendation("ac-1")])
        await until(pilot, lambda: app.recs_view.selected is not None)
        await pilot.press("a")
        await until(pilot, lambda: source.calls)
        # The UI keeps polling and drawing while the worker waits on the source.
        source.add_steps(2)
        await until(pilot, lambda: any(m.latest_step == 1 for m in of(messages, StateRefreshed)))
        assert "applying" in app.result_view.plain
        # A second `a` while one is in flight is refused without calling the source.
        await pilot.press("a")
        assert "already in flight" in of(messages, ApplyRefused)[-1].reason
        assert source.calls == [("apply", "ac-1")]
        assert source.apply_gate is not None
        source.apply_gate.set()
        await until(pilot, lambda: of(messages, ApplySent))

    run(scenario, source)


def test_apply_failure_shows_error_and_app_stays_usable() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.advise([recommendation("ac-1"), recommendation("ac-2", title="Checkpoint 2 blocks")])
        await until(pilot, lambda: len(app.recs_view.recommendations) == 2)
        await pilot.press("a")
        await until(pilot, lambda: of(messages, ApplySent))
        source.finish_apply(applied("ac-1", status="failed", error="RuntimeError: hook already registered"))
        await until(pilot, lambda: of(messages, ApplyFinished))
        assert of(messages, ApplyFinished)[0].status == "failed"
        text = app.result_view.plain
        assert "✗ failed" in text and "error: RuntimeError: hook already registered" in text
        # Usable: move to the next recommendation and apply it.
        await pilot.press("6", "down", "a")  # the Advice view holds the recommendations table
        await until(pilot, lambda: len(source.calls) == 2)
        assert source.calls[-1] == ("apply", "ac-2")

    run(scenario)


def test_apply_rejected_by_source_or_raising_is_reported() -> None:
    source = FakeSource()
    source.apply_error = "the job is not at a step boundary yet"

    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.advise([recommendation("ac-1")])
        await until(pilot, lambda: app.recs_view.selected is not None)
        await pilot.press("a")
        await until(pilot, lambda: of(messages, ApplySent))
        await pilot.pause()
        assert of(messages, ApplySent)[0].error == "the job is not at a step boundary yet"
        assert "could not apply Checkpoint 4 transformer blocks: the job is not at a step boundary yet" in (
            app.result_view.plain
        )
        assert "applying" not in app.result_view.plain
        # A source that raises is reported the same way, and the app can try again.
        source.apply_error = None
        source.apply_raises = ConnectionError("controller lost the agent")
        await pilot.press("a")
        await until(pilot, lambda: len(of(messages, ApplySent)) == 2)
        await pilot.pause()
        assert "ConnectionError: controller lost the agent" in app.result_view.plain

    run(scenario, source)


def test_apply_refuses_recommendations_that_are_not_live() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        await pilot.press("a")
        assert of(messages, ApplyRefused)[-1].reason == "No recommendation to apply yet."
        source.advise([recommendation("mb-2", title="Halve the micro-batch", live=False)])
        await until(pilot, lambda: app.recs_view.selected is not None)
        await pilot.press("a")
        refused = of(messages, ApplyRefused)[-1]
        assert refused.recommendation_id == "mb-2" and "needs a restart" in refused.reason
        assert source.calls == []

    run(scenario)


def test_revert_last_kept_remedy() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.advise([recommendation("ac-1")])
        await pilot.press("r")
        assert "Nothing to revert" in of(messages, RevertRefused)[-1].reason
        source.finish_apply(applied("ac-1", status="kept"))
        await until(pilot, lambda: len(app.state.applied) == 1)
        await pilot.press("r")
        await until(pilot, lambda: of(messages, RevertSent))
        assert source.calls == [("revert",)]
        assert of(messages, RevertRequested)[0].recommendation_id == "ac-1"
        assert "reverting activation_checkpointing at next step boundary…" in app.result_view.plain
        source.finish_apply(applied("ac-1", status="reverted", reason="reverted on request"))
        await until(pilot, lambda: "reverting" not in app.result_view.plain)
        assert "↺ reverted" in app.result_view.plain and "why: reverted on request" in app.result_view.plain
        await pilot.press("r")
        assert "Nothing to revert" in of(messages, RevertRefused)[-1].reason

    run(scenario)


def test_revert_error_from_source_is_shown() -> None:
    source = FakeSource()
    source.revert_error = "no remedy to revert on rank 1"

    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.finish_apply(applied("ac-1", status="kept"))
        await until(pilot, lambda: len(app.state.applied) == 1)
        await pilot.press("r")
        await until(pilot, lambda: of(messages, RevertSent))
        await pilot.pause()
        assert "could not revert: no remedy to revert on rank 1" in app.result_view.plain

    run(scenario, source)


def test_enter_opens_evidence_and_escape_closes_it() -> None:
    curve = [
        CurvePoint(budget_bytes=2 * 1024**3, overhead_s=0.03, peak_memory_bytes=2 * 1024**3, modules_count=6),
        CurvePoint(budget_bytes=1024**3, overhead_s=0.05, peak_memory_bytes=1024**3, modules_count=8),
    ]

    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.advise([recommendation("ac-1", curve=curve)])
        await until(pilot, lambda: app.recs_view.selected is not None)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, EvidenceScreen))
        screen = app.screen
        assert isinstance(screen, EvidenceScreen)
        evidence = str(screen.query_one("#evidence").content)  # type: ignore[attr-defined]
        assert "activations are 70% of peak memory" in evidence
        assert "modules = layers.0, layers.1, layers.2, layers.3" in evidence
        assert "Predicted peak memory: 3.00 GiB → 2.00 GiB (-33%)" in evidence
        chart = str(screen.query_one("#curve").content)  # type: ignore[attr-defined]
        lines = chart.splitlines()
        assert lines[0] == "Trade-off curve"
        assert lines[2].lstrip().startswith("1.00 GiB") and lines[2].rstrip().endswith("8")  # smallest first
        assert "+50.0 ms" in lines[2] and "+30.0 ms" in lines[3]
        # `a` on the evidence screen applies what it shows.
        await pilot.press("a")
        await until(pilot, lambda: source.calls)
        assert source.calls == [("apply", "ac-1")]
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, EvidenceScreen))

    run(scenario)


def test_training_ends_with_exception_and_everything_stays() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        assert not app.exit_banner.display
        source.add_steps(7)
        source.advise([recommendation("ac-1")])
        info = ExitInfo(
            code=1,
            reason="exception",
            exc_type="torch.OutOfMemoryError",
            message="CUDA out of memory. Tried to allocate 2.00 GiB",
            frame={"file": "train.py", "line": 42, "function": "main", "code": "    loss = model(x).sum()\n"},
            steps=7,
        )
        source.end(code=1, reason="exception", exits=[info])
        await until(pilot, lambda: of(messages, TrainingEnded))
        ended = of(messages, TrainingEnded)
        assert len(ended) == 1 and ended[0].exit_code == 1 and ended[0].reason == "exception"
        assert app.exit_banner.display
        banner = app.exit_banner.plain
        assert "Training ended: exception (exit code 1) after 7 steps" in banner
        assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in banner
        assert "at train.py:42 in main" in banner and "loss = model(x).sum()" in banner
        # History stays on screen; applying to a dead job is refused without calling the source.
        assert app.steps_view.query_one("#steps-table", DataTable).row_count == 7
        await pilot.press("a")
        assert "Training has ended" in of(messages, ApplyRefused)[-1].reason
        await pilot.press("q")

    app, _ = run(scenario)
    assert app.return_value == RESULT_FINISHED
    # The job was over already: nothing to stop.
    assert app.source.calls == []  # type: ignore[attr-defined]


def test_memory_line_and_apply_cut_short_by_the_end() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.add_steps(1)
        source.live.add(
            MemorySample(step=0, time=0.0, categories={"parameter": 1024**3, "activation": 2 * 1024**3}, total_bytes=3 * 1024**3)
        )
        source.advise([recommendation("ac-1")])
        await until(pilot, lambda: "memory" in app.steps_view.summary_text)
        assert "memory 3.00 GiB   activation 2.00 GiB   parameter 1.00 GiB" in app.steps_view.summary_text
        await pilot.press("a")
        await until(pilot, lambda: of(messages, ApplySent))
        source.end(code=0, reason="completed")
        await until(pilot, lambda: of(messages, TrainingEnded))
        assert "was not applied: training ended first" in app.result_view.plain
        assert "applying" not in app.result_view.plain
        assert "Training ended: completed (exit code 0)" in app.exit_banner.plain

    run(scenario)


@pytest.mark.parametrize(("key", "result"), [("l", RESULT_LEFT_RUNNING), ("s", RESULT_STOP_TRAINING)])
def test_quit_while_training_runs_asks_what_to_do_with_the_job(key: str, result: str) -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.add_steps(2)
        await until(pilot, lambda: app.state.latest_step() == 1)
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        await pilot.press("escape")  # back: nothing decided, the UI goes on
        assert not isinstance(app.screen, QuitScreen) and app.is_running and source.calls == []
        await pilot.press("q", key)

    app, _ = run(scenario)
    assert app.return_value == result  # the CLI stops the job, or goes on recording it (advisor/attach.py)
    assert app.source.calls == [("stop",)]  # type: ignore[attr-defined]


def test_broken_snapshot_keeps_the_app_running() -> None:
    async def scenario(app: AdvisorApp, pilot: Pilot[str], source: FakeSource, messages: list[Message]) -> None:
        source.add_steps(2)
        await until(pilot, lambda: app.state.latest_step() == 1)
        source.snapshot_raises = RuntimeError("lock poisoned")
        await pilot.pause(POLL * 4)
        assert app.is_running and app.state.latest_step() == 1
        source.snapshot_raises = None
        source.add_steps(1)
        await until(pilot, lambda: app.state.latest_step() == 2)

    run(scenario)


def test_last_kept_walks_the_stack() -> None:
    assert last_kept([]) is None
    history = [applied("a", status="kept"), applied("b", status="kept"), applied("b", status="reverted")]
    assert last_kept(history).recommendation_id == "a"  # type: ignore[union-attr]
    assert last_kept([applied("a", status="failed")]) is None
