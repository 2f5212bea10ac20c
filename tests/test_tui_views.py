"""The text each view draws, checked without an app; and the TUI's import hygiene."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tui_fakes import DIAGNOSIS, applied, recommendation

from advisor.records.advice import BlockChoice
from advisor.state import PendingApply, SessionState
from advisor.tui.evidence_screen import curve_text, evidence_text
from advisor.tui.exit_banner import exit_text
from advisor.tui.recommendations_view import diagnosis_text, status_by_recommendation
from advisor.tui.result_view import describe_result, result_text
from advisor.records.samples import ExitInfo, StepSample


def test_exit_text_empty_while_running_and_green_path_when_completed() -> None:
    state = SessionState()
    assert str(exit_text(state)) == ""
    state.steps = {0: [StepSample(index=0, time_s=0.1)]}
    state.finished, state.exit_code, state.exit_reason = True, 0, "completed"
    assert str(exit_text(state)).startswith("Training ended: completed (exit code 0) after 1 step\n")


def test_exit_text_names_each_failing_rank() -> None:
    state = SessionState(finished=True, exit_code=1)
    state.exits = {
        0: ExitInfo(rank=0, code=0, reason="killed"),
        1: ExitInfo(rank=1, code=1, reason="exception", exc_type="ValueError", message="bad shape"),
    }
    text = str(exit_text(state))
    assert "Training ended: killed (exit code 1)" in text  # the first rank's reason when none given
    assert "rank 1: ValueError: bad shape" in text
    assert "rank 0" not in text


def test_exit_text_falls_back_to_output_tail_without_exception() -> None:
    state = SessionState(finished=True, exit_code=-9, exit_reason="killed by signal 9")
    state.output_tail = [f"line {i}" for i in range(10)]
    text = str(exit_text(state))
    assert "Training ended: killed by signal 9 (exit code -9)" in text
    assert "the script's last output" in text and "line 9" in text and "line 3" not in text


def test_result_text_prefers_pending_from_source_and_lists_newest_first() -> None:
    state = SessionState(recommendations=[recommendation("ac-1")])
    assert "No remedy applied yet" in str(result_text(state, None, None))
    state.pending_apply = PendingApply(recommendation_id="ac-1", requested_at=0.0)
    assert str(result_text(state, None, None)) == (
        "⟳ applying Checkpoint 4 transformer blocks at next step boundary…"
    )
    state.pending_apply = None
    state.applied = [applied("ac-1", status="kept", at_step=3), applied("ac-1", status="reverted", at_step=9)]
    lines = str(result_text(state, None, None)).splitlines()
    assert lines[0].startswith("↺ reverted") and "from step 9" in lines[0]
    assert any(line.startswith("✓ kept") for line in lines)


def test_describe_failed_result_without_error_text_still_says_failed() -> None:
    result = applied("x", status="failed")
    assert result.error is None
    text = str(describe_result(result))
    assert text.startswith("✗ failed  activation_checkpointing from step 12")
    assert "error: no error text reported" in text and "rolled back" in text


def test_diagnosis_and_statuses() -> None:
    assert "no diagnosis yet" in str(diagnosis_text(None))
    text = str(diagnosis_text(DIAGNOSIS, [recommendation()]))
    assert "Baseline: peak 3.00 GiB, 100 ms/step" in text
    state = SessionState(applied=[applied("a", status="failed")],
                         pending_apply=PendingApply(recommendation_id="b", requested_at=0.0))
    assert status_by_recommendation(state) == {"a": "failed", "b": "applying…"}


def test_evidence_shows_the_option_each_block_got() -> None:
    rec = recommendation("offload-2-checkpoint-1", block_plan=[
        BlockChoice(name="blocks.0", choice="offload"), BlockChoice(name="blocks.1", choice="recompute"),
        BlockChoice(name="blocks.2", choice="offload"), BlockChoice(name="blocks.3", choice="keep")])
    lines = str(evidence_text(rec)).splitlines()
    start = lines.index("Plan per block")
    assert [line.split() for line in lines[start + 1:start + 5]] == [
        ["blocks.0", "offload"], ["blocks.1", "recompute"], ["blocks.2", "offload"], ["blocks.3", "keep"]]
    assert "Plan per block" not in str(evidence_text(recommendation("mb")))


def test_evidence_for_a_restart_only_remedy_without_curve() -> None:
    rec = recommendation("mb", live=False, evidence=[])
    text = str(evidence_text(rec))
    assert "Not live: it needs a restart" in text and "none recorded" in text
    assert str(curve_text(rec.curve)) == "No trade-off curve for this remedy."


def test_tui_never_imports_torch_and_format_never_imports_textual(repo_root: Path) -> None:
    code = (
        "import sys\n"
        "import advisor.tui.format\n"
        "assert 'textual' not in sys.modules, 'format pulled in textual'\n"
        "from advisor.tui import make_app\n"
        "import advisor.tui.app\n"
        "assert 'torch' not in sys.modules, 'the TUI pulled in torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_a_line_of_the_scripts_output_keeps_its_text_and_colours_and_drops_control_codes() -> None:
    from advisor.tui.views.output import output_text

    red = output_text("\x1b[31mloss\x1b[0m 0.5")
    assert red.plain == "loss 0.5" and red.spans[0].style.color.number == 1  # ANSI red
    assert output_text("\x1b]0;a title\x07step\x00 1\tloss").plain == "step 1  loss"  # the tab to column 8
