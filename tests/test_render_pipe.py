"""The rich report in a pipe or a CI log: wide enough, names never cut, and no 'code None'."""

from __future__ import annotations

import io
import json

import pytest

from advisor.records.samples import MEMORY_CATEGORIES, MemorySample, ModuleStat, OpStat, RunInfo, StepSample
from advisor.render import emit_report, exit_line, report_console
from advisor.report import build_report
from advisor.state import LiveState

LONG_MODULE = "transformer.encoder.layers.11.self_attention.query_key_value_projection"
LONG_OP = "aten._scaled_dot_product_flash_attention_for_cpu_backward"


def _state():
    live = LiveState(session_id="s1")
    live.add(RunInfo(script="train.py", argv=[], device={"type": "cpu", "name": "x"}))
    for index, deep in ((0, False), (1, True), (2, False), (3, False)):
        live.add(StepSample(index=index, time_s=0.2 if deep else 0.1, deep=deep, end_time=100.0 + index))
    full = {c: 0 for c in MEMORY_CATEGORIES} | {"activation": 34407204}
    live.add(MemorySample(step=1, time=0.01, event="op", categories=full, total_bytes=34407204))
    live.add(ModuleStat(step=1, name=LONG_MODULE, type="Linear", depth=6, activation_bytes=264192,
                        forward_s=0.002, backward_s=0.004))
    live.add(OpStat(step=1, name=LONG_OP, module=LONG_MODULE, phase="backward", count=1, flops=1e6,
                    bytes=1e5, time_s=0.05, dtype="float32"))
    return live.snapshot()


def test_pipe_width_is_at_least_120_or_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert report_console(io.StringIO()).width == 120
    monkeypatch.setenv("COLUMNS", "160")
    assert report_console(io.StringIO()).width == 160


@pytest.mark.parametrize("columns", ["80", None])
def test_names_are_never_truncated_in_a_pipe(monkeypatch: pytest.MonkeyPatch, columns: str | None) -> None:
    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    emit_report(build_report(_state()), "text", out)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 120
    # A name may fold onto more lines of its cell, never be cut: join each table's first column.
    cells = ["".join(line.split("│")[1].strip() for line in block.splitlines() if line.startswith("│"))
             for block in text.split("└")]
    assert any(LONG_OP in cell for cell in cells)
    assert any(LONG_MODULE in cell for cell in cells)
    assert "…" not in text
    assert "32.8 MiB" in text and "258 KiB" in text
    assert "\x1b[" not in text
    assert "code None" not in text and "no exit recorded" in text


def test_json_and_markdown_formats() -> None:
    report = build_report(_state())
    out = io.StringIO()
    emit_report(report, "json", out)
    assert json.loads(out.getvalue())["schema"] == "advisor.report/1"
    out = io.StringIO()
    emit_report(report, "markdown", out)
    text = out.getvalue()
    escaped = LONG_OP.replace("._", ".\\_")  # an underscore that could open emphasis is escaped
    assert f"| {escaped} | {LONG_MODULE} | backward |" in text
    assert "still running or interrupted: no exit recorded" in text


def test_exit_line() -> None:
    assert exit_line({"code": None, "reason": ""}) == "still running or interrupted: no exit recorded"
    assert exit_line({"code": 0, "reason": "completed"}) == "code 0 · completed"
