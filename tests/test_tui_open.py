"""``advisor open SESSION``: a stored session in the TUI, read-only; errors are one line."""

from __future__ import annotations

import asyncio

import pytest
from recorded import write_session

from advisor.cli import main
from advisor.tui import make_app
from advisor.tui.messages import AdviceRecomputed
from advisor.tui.recorded_source import READ_ONLY, RecordedSource
from advisor.tui.results import RESULT_FINISHED

pytestmark = pytest.mark.timeout(60)


def test_open_reads_the_stored_session_read_only(tmp_path) -> None:
    db = write_session("oom", tmp_path)
    source = RecordedSource.open(db)
    assert source.snapshot().finished and source.snapshot().exit_code == 1
    assert source.apply("checkpoint-blocks-4") == READ_ONLY and source.revert() == READ_ONLY
    app = make_app(source, poll_interval=0.02)
    messages: list = []

    async def scenario() -> None:
        async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
            while not any(isinstance(m, AdviceRecomputed) for m in messages):
                await pilot.pause(0.02)
            shown = {b.binding.key for b in app.active_bindings.values() if b.binding.show}
            assert {"b", "p"} <= shown  # budget and plan; apply and revert are greyed (no job)
            assert app.check_action("apply", ()) is None and app.check_action("revert", ()) is None
            await pilot.press("q")  # a recorded session: no question, nothing to stop

    asyncio.run(scenario())
    assert app.return_value == RESULT_FINISHED
    assert [r.id for r in source.snapshot().recommendations] == ["checkpoint-blocks-4"]


def test_open_errors_are_one_line_with_a_hint(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path))
    assert main(["open", "no-such-session"]) == 3
    assert "no session 'no-such-session'" in capsys.readouterr().err
    write_session("gpt", tmp_path)
    assert main(["open", "latest"]) == 2  # pytest's stdin is not a terminal
    err = capsys.readouterr().err
    assert "advisor open needs a terminal" in err and "advisor report latest" in err
