"""Every user-derived string is text, never markup: module and op names, script paths and exception
texts with ``[``, ``]``, ``\\``, escape sequences and control characters go through every renderer
(the rich report, Markdown, the TUI's cells) as they are, with terminal control sequences
stripped. A module named ``[/]`` stopped ``advisor attach`` with a ``MarkupError``."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from textual.widgets._data_table import default_cell_formatter

from advisor.diff import compute_diff
from advisor.diff_render import print_diff
from advisor.paths import DB_NAME
from advisor.records.samples import ExitInfo, MemorySample, ModuleStat, OpStat, RunInfo, StepSample
from advisor.records.units import plain_text
from advisor.render import print_report
from advisor.report import build_report
from advisor.report_markdown import report_markdown
from advisor.rich_text import name_text
from advisor.state import LiveState
from advisor.store import SessionStore

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "markup_names.py"
ESCAPES = ("\x1b[31m", "\x1b[0m", "\x1b[2J", "\x1b]8;;http://x\x07", "\x1b]0;title\x1b\\", "\x9b1m", "\x07", "\x00",
           "\x08", "\r", "\x7f")
PIECES = st.one_of(st.sampled_from(("[", "]", "\\", "[/]", "[bold]", "[/bold]", "[red on blue]", "|", "`", "*",
                                    "_", "<lambda>", "__init__", "~", "#")),
                   st.sampled_from(ESCAPES),
                   st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), min_size=1, max_size=6))
NAMES = st.lists(PIECES, min_size=1, max_size=6).map("".join).filter(lambda n: plain_text(n).strip() != "")
_MD_ESCAPE = re.compile(r"\\([\\`*_\[\]<>|~])")


def _state(name: str) -> LiveState:
    live = LiveState(session_id="names")
    live.add(RunInfo(script=f"/tmp/{name}.py", argv=[name], device={"type": "cpu", "name": name}))
    for index, deep in ((0, False), (1, True), (2, False), (3, False)):
        live.add(StepSample(index=index, time_s=0.1, deep=deep, phases={"forward_s": 0.04, "other_s": 0.06}))
    live.add(MemorySample(step=1, time=0.0, event="op", module=name, categories={"activation": 1 << 20},
                          total_bytes=1 << 20))
    live.add(ModuleStat(step=1, name=f"blocks.{name}", type="Linear", depth=2, activation_bytes=1 << 20,
                        forward_s=0.01, backward_s=0.02))
    live.add(OpStat(step=1, name="aten.mm", module=f"blocks.{name}", phase="forward", count=1, flops=1e6,
                    bytes=1e5, time_s=0.01, dtype="float32"))
    live.add(ExitInfo(code=1, reason=f"ValueError: {name}", exc_type="ValueError", message=name))
    live.update(finished=True, exit_code=1, exit_reason=f"ValueError: bad shard {name}")
    return live


def _rich(report: dict) -> str:
    out = io.StringIO()
    print_report(report, Console(file=out, width=400, color_system=None))
    return out.getvalue()


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=NAMES)
def test_random_names_render_as_text_on_every_surface(name: str) -> None:
    shown = plain_text(name)
    assert "\x1b" not in shown and not re.search(r"[\x00-\x1f\x7f-\x9f]", shown)
    report = build_report(_state(name).snapshot())
    text = _rich(report)
    assert f"blocks.{shown}" in text and f"ValueError: bad shard {shown}" in text
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text)  # no control sequence reaches a terminal
    markdown = report_markdown(report)
    assert f"blocks.{shown}" in _MD_ESCAPE.sub(r"\1", markdown)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", markdown)
    cell = default_cell_formatter(name_text(name))  # what a Textual DataTable does with the cell
    assert cell.plain == shown
    state = _state(name).snapshot()
    out = io.StringIO()
    print_diff(compute_diff(state, report, state, report), Console(file=out, width=400, color_system=None))
    assert f"/tmp/{shown}.py" in out.getvalue() and "\x1b" not in out.getvalue()


def test_control_sequences_are_stripped_and_every_other_character_kept() -> None:
    assert plain_text("a\x1b[31mb\x1b[0m[/]\\c\x07d\x1b]8;;http://x\x07e\x1b]8;;\x07") == "ab[/]\\cde"
    assert plain_text("line1\nline2\tx") == "line1 line2 x"
    assert plain_text("line1\nline2\r\n", one_line=False) == "line1\nline2\n"


def _write_session(home: Path) -> Path:
    folder = home / "sessions" / "20260101-000000-names-0001"
    folder.mkdir(parents=True, mode=0o700)
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, finished=True, exit_code=1, exit_reason="ValueError: [/data] \x1b[2J")
    for record in _state("[/]").snapshot().steps[0]:
        store.put(record)
    live = _state("[/]")
    snapshot = live.snapshot()
    for record in [*snapshot.runs.values(), *snapshot.memory, *snapshot.modules, *snapshot.ops,
                   *snapshot.exits.values()]:
        store.put(record)
    store.close()
    return folder / DB_NAME


def test_a_bracket_named_module_opens_in_every_view_of_the_tui(tmp_path) -> None:
    import asyncio

    from textual.widgets import DataTable

    from advisor.tui import make_app
    from advisor.tui.messages import AdviceRecomputed
    from advisor.tui.recorded_source import RecordedSource

    app = make_app(RecordedSource.open(_write_session(tmp_path)), poll_interval=0.02)
    app.animation_level = "none"
    messages: list = []
    seen: list[str] = []

    async def scenario() -> None:
        async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
            while not any(isinstance(m, AdviceRecomputed) for m in messages):
                await pilot.pause(0.02)
            for key in "1234567":
                await pilot.press(key)
                await pilot.pause(0.05)
            table = app.query_one("#modules-table", DataTable)
            seen.extend(str(table.get_row_at(i)[0]) for i in range(table.row_count))
            await pilot.press("q")

    asyncio.run(scenario())
    assert "blocks.[/]" in seen


@pytest.mark.slow
def test_a_bracket_named_module_runs_under_attach_and_its_report_opens(tmp_path) -> None:
    env = {**__import__("os").environ, "ADVISOR_HOME": str(tmp_path / "home")}
    report = tmp_path / "report.txt"
    run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--json", str(tmp_path / "r.json"),
                          "--report", str(report), str(SCRIPT), "--fail"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]  # the script's own exit code: it raised
    assert "MarkupError" not in run.stderr and "done" in run.stdout
    ours = [line for line in run.stderr.splitlines() if line.startswith("advisor:")]
    assert ours and not any("\x1b" in line for line in ours)
    assert any("bad shard [/data/x] [bold]y[/] cleared" in line for line in ours)
    text = report.read_text()
    assert "blocks.[/]" in text and "blocks.[bold]x" in text and "blocks.a\\b" in text and "blocks.redtext" in text
    assert "\x1b" not in text
    again = subprocess.run([sys.executable, "-m", "advisor", "report", "latest"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "blocks.[/]" in again.stdout and "bad shard [/data/x] [bold]y[/] cleared" in again.stdout
    markdown = subprocess.run([sys.executable, "-m", "advisor", "report", "latest", "--format", "markdown"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
    assert markdown.returncode == 0 and "blocks.\\[/\\]" in markdown.stdout
