"""After the controller dies: spill files are read in place (never renamed under a writer), and a
session whose ranks all reported their exit shows as finished."""

import json
import os
import subprocess
import sys
from pathlib import Path

from advisor.paths import DB_NAME, new_session_dir
from advisor.records.samples import ExitInfo, RunInfo, StepSample
from advisor.store import SessionStore, load_state

ROOT = Path(__file__).resolve().parents[1]


def _orphaned_session():
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, finished=False, nproc_per_node=1)
    store.put(RunInfo(script="t.py", argv=[]))
    store.put(StepSample(index=0, time_s=0.1))
    store.close()  # the controller is gone; the agent spills from here on
    return folder


def _line(record) -> str:
    return json.dumps({"kind": record.KIND, "data": record.to_dict()}) + "\n"


def test_a_spill_file_still_being_written_is_read_again_later_and_never_renamed():
    folder = _orphaned_session()
    spill = folder / "spill-rank0.jsonl"
    with open(spill, "a") as writer:  # the orphaned agent keeps this open and appends
        writer.write(_line(StepSample(index=1, time_s=0.1)) + '{"kind": "step", "da')  # a torn last line
        writer.flush()
        first = load_state(folder / DB_NAME)
        assert [s.index for s in first.steps[0]] == [0, 1]
        assert not first.finished
        writer.write('ta": {}}\n' + _line(StepSample(index=2, time_s=0.1)))
        writer.write(_line(ExitInfo(code=0, reason="completed", steps=3)))
    assert sorted(p.name for p in folder.iterdir()) == [DB_NAME, "spill-rank0.jsonl"]
    later = load_state(folder / DB_NAME)
    assert [s.index for s in later.steps[0]] == [0, 1, 2]


def test_a_recovered_session_is_finished_with_the_code_from_its_exit_records():
    folder = _orphaned_session()
    (folder / "spill-rank0.jsonl").write_text(
        _line(StepSample(index=1, time_s=0.1))
        + _line(ExitInfo(code=3, reason="sys.exit(3)", steps=2)))
    state = load_state(folder / DB_NAME)
    assert state.finished
    assert state.exit_code == 3
    assert "sys.exit(3)" in state.exit_reason and "recovered" in state.exit_reason


def test_a_session_still_missing_a_rank_exit_stays_unfinished():
    folder = _orphaned_session()
    (folder / "spill-rank0.jsonl").write_text(
        _line(RunInfo(script="t.py", argv=[], rank=0, world_size=2))
        + _line(ExitInfo(rank=0, code=0, reason="completed", steps=2)))
    state = load_state(folder / DB_NAME)
    assert not state.finished and state.exit_code is None


def test_sessions_lists_a_recovered_session_as_finished():
    import io

    from rich.console import Console

    from advisor.listing import print_sessions

    folder = _orphaned_session()
    (folder / "spill-rank0.jsonl").write_text(_line(ExitInfo(code=3, reason="sys.exit(3)", steps=2)))
    out = io.StringIO()
    print_sessions(Console(file=out, width=300))
    assert "exit 3: sys.exit(3)" in out.getvalue()


def test_a_spill_file_that_is_not_a_regular_file_is_skipped_not_read(tmp_path):
    """A FIFO named like a spill file hung `advisor report` (an open for reading waits for a
    writer); a link to /dev/zero would never end. Both are skipped with a warning."""
    folder = _orphaned_session()
    os.mkfifo(folder / "spill-rank1.jsonl")
    os.symlink("/dev/zero", folder / "spill-rank2.jsonl")
    with open(folder / "spill-rank3.jsonl", "w") as spill:
        spill.write(_line(StepSample(index=1, time_s=0.1)))
    run = subprocess.run([sys.executable, "-m", "advisor", "report", str(folder), "--json", str(tmp_path / "r.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    warnings = json.loads((tmp_path / "r.json").read_text())["warnings"]
    assert any("spill-rank1.jsonl is not a regular file" in w for w in warnings), warnings
    assert any("spill-rank2.jsonl is a symbolic link" in w for w in warnings), warnings
    assert [s.index for s in load_state(folder / DB_NAME).steps[0]] == [0, 1]  # the regular one is read
