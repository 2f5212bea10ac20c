"""Following the script's output file: incremental, line by line, bounded whatever the script prints."""

from __future__ import annotations

from pathlib import Path

from advisor.output_tail import MAX_LINE, OutputFollower, read_tail
from advisor.state import OUTPUT_KEEP, LiveState


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_lines_are_handed_on_as_they_complete_and_each_only_once(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    lines: list[str] = []
    follower = OutputFollower(path, lines.append)
    assert follower.poll() == 0  # no file yet: nothing, no error
    _append(path, b"step 0 loss 6.35\nstep 1 lo")
    assert follower.poll() == 1 and lines == ["step 0 loss 6.35"]
    assert follower.poll() == 0  # nothing new
    _append(path, b"ss 6.40\n")
    assert follower.poll() == 1 and lines[-1] == "step 1 loss 6.40"
    _append(path, b"Traceback (most recent call last):\r\n  \xff bad byte\nno newline at the end")
    follower.stop()  # the last line without a newline is handed on at the end
    assert lines[2:] == ["Traceback (most recent call last):", "  \ufffd bad byte", "no newline at the end"]
    assert follower.offset == path.stat().st_size


def test_a_progress_bar_redrawn_with_carriage_returns_shows_its_last_state(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    lines: list[str] = []
    follower = OutputFollower(path, lines.append)
    _append(path, b" 10%|#   |\r 50%|####|\r100%|####|\n")
    follower.poll()
    assert lines == ["100%|####|"]


def test_memory_stays_bounded_when_the_script_floods_its_output(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    lines: list[str] = []
    follower = OutputFollower(path, lines.append, max_backlog=4096)
    _append(path, b"".join(b"line %06d\n" % i for i in range(5000)))  # 60 KB between two polls
    follower.poll()
    assert lines[0].startswith("[advisor: ") and "bytes of output not shown here" in lines[0]
    assert str(path) in lines[0]
    assert lines[-1] == "line 004999"
    assert len(lines) < 400  # only the last 4 KiB were read
    skipped = int(lines[0].split()[1])
    assert skipped + sum(len(line) + 1 for line in lines[1:]) == path.stat().st_size


def test_a_line_without_end_is_cut_and_its_rest_dropped(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    lines: list[str] = []
    follower = OutputFollower(path, lines.append)
    _append(path, b"x" * (MAX_LINE * 5))
    follower.poll()
    assert lines == ["x" * MAX_LINE]
    _append(path, b"y" * 100 + b"\nnext\n")  # the rest of the long line, then a new one
    follower.poll()
    assert lines == ["x" * MAX_LINE, "next"]


def test_live_state_keeps_the_newest_lines_and_counts_all(tmp_path: Path) -> None:
    live = LiveState()
    for i in range(OUTPUT_KEEP + 5):
        live.append_output(f"line {i}")
    state = live.snapshot()
    assert state.output_lines == OUTPUT_KEEP + 5
    assert len(state.output_tail) == OUTPUT_KEEP and state.output_tail[-1] == f"line {OUTPUT_KEEP + 4}"
    assert state.output_tail[0] == "line 5"


def test_read_tail_of_a_finished_file(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    path.write_bytes(b"a\nb\nc")
    assert read_tail(path) == ["a", "b", "c"]
    assert read_tail(tmp_path / "missing.log") == []
