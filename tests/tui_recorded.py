"""Run the TUI over a recorded session of tests/data, as ``advisor open`` does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from recorded import load_state
from textual.message import Message
from textual.pilot import Pilot

from advisor.state import SessionState
from advisor.tui import make_app
from advisor.tui.app import AdvisorApp
from advisor.tui.messages import AdviceRecomputed
from advisor.tui.recorded_source import RecordedSource

POLL = 0.02
Scenario = Callable[[AdvisorApp, Pilot[str], list[Message]], Awaitable[Any]]


def open_recorded(name: str, scenario: Scenario, *, size: tuple[int, int] = (120, 40),
                  budget_bytes: int | None = None,
                  prepare: Callable[[SessionState], SessionState] | None = None) -> tuple[AdvisorApp, list[Message], Any]:
    """``prepare``: change the loaded state first (add the output a run under the TUI would have)."""
    state = load_state(name)
    app = make_app(RecordedSource(prepare(state) if prepare else state), title=f"advisor · {name}",
                   poll_interval=POLL, budget_bytes=budget_bytes)
    app.animation_level = "none"  # tab underlines slide otherwise: snapshots would catch them mid-way
    messages: list[Message] = []
    out: list[Any] = []

    async def main() -> None:
        async with app.run_test(size=size, message_hook=messages.append) as pilot:
            # The recorded advice is recomputed in a worker, then the model is rebuilt from it.
            await until(pilot, lambda: any(isinstance(m, AdviceRecomputed) for m in messages))
            await until(pilot, lambda: app.model is not None and app.model.recommendations == app.state.recommendations)
            await settle(app, pilot)
            out.append(await scenario(app, pilot, messages))
            await settle(app, pilot)

    asyncio.run(main())
    return app, messages, out[0]


async def until(pilot: Pilot[str], condition: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(POLL)


async def settle(app: AdvisorApp, pilot: Pilot[str]) -> None:
    """Wait until the workers are done (a rebuilt model cancels the one before it: exclusive
    workers) and their messages handled."""
    for _ in range(2):
        await until(pilot, lambda: not any(w.is_running for w in app.workers))
        await pilot.pause(POLL)
