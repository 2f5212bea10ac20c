"""Text from the user's process (exception messages, paths) is rendered as text, never as markup."""

import io

from rich.console import Console

from advisor.listing import print_sessions
from advisor.paths import DB_NAME, new_session_dir
from advisor.records.samples import ExitInfo, RunInfo, StepSample
from advisor.render import print_exit_summary, print_report
from advisor.report import build_report
from advisor.state import LiveState
from advisor.store import SessionStore

GLOO = "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer"
SHARD = "ValueError: could not open shard [/data/shard-0] [bold]x[/]"


def _state(reason: str):
    live = LiveState(session_id="s[red]1")
    live.add(RunInfo(script="/tmp/[b]train.py", argv=["--x", "[/y]"], device={"type": "cpu", "name": "[cpu]"}))
    live.add(StepSample(index=0, time_s=0.1, loss=1.0))
    live.add(ExitInfo(code=1, reason="exception", exc_type="ValueError", message="[/data/shard-0]"))
    live.update(finished=True, exit_code=1, exit_reason=reason)
    return live.snapshot()


def _render(func, report) -> str:
    out = io.StringIO()
    func(report, console=Console(file=out, width=300, color_system=None))
    return out.getvalue()


def test_bracketed_exception_text_prints_verbatim_in_the_report():
    for reason in (GLOO, SHARD):
        report = build_report(_state(reason))
        report["warnings"].append("shard [/data/a] missing [/]")
        text = _render(print_report, report)
        assert reason in text
        assert "shard [/data/a] missing [/]" in text
        assert "/tmp/[b]train.py --x [/y]" in text
        assert reason in _render(print_exit_summary, report)


def test_sessions_listing_survives_bracketed_reasons():
    for reason in (GLOO, SHARD):
        folder = new_session_dir("t[/x].py")
        store = SessionStore(folder / DB_NAME)
        store.set_meta(session_id=folder.name, script="/a/[/b].py", created=0.0, finished=True,
                       exit_code=1, exit_reason=reason)
        store.close()
    out = io.StringIO()
    assert print_sessions(Console(file=out, width=400, color_system=None)) == 0
    text = out.getvalue()
    assert "[/__w/pytorch/pytorch" in text and "[/data/shard-0]" in text and "/a/[/b].py" in text


def test_sessions_listing_sends_no_control_sequence_of_the_users_process():
    """A script path and an exit reason come from the user's process: an ESC in them reached the
    terminal through ``advisor sessions`` (its cells were Text, not the one name cell)."""
    folder = new_session_dir("esc.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, script="/a/\x1b[2Jesc.py", created=0.0, finished=True,
                   exit_code=1, exit_reason="ValueError: \x1b]0;title\x07bad \x1b[31mred")
    store.close()
    out = io.StringIO()
    assert print_sessions(Console(file=out, width=400, color_system=None)) == 0
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "esc.py" in text and "bad" in text
