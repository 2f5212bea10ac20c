"""Memory and time bombs in artifacts: refused in one line (exit 3) within 60 s under a 1 GiB
address-space cap, with no session left behind; a valid snapshot imports under the same cap.

Every bomb is generated here. Before these were checked, the 633-byte trace below took 24 GB,
the snapshot's repeated list a 100 GB string, the memo slot 16 GiB, and a valid 300-byte
snapshot failed under any ``ulimit -v`` below 4.4 GB (the reader allocated its 4 GiB limit).
"""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import pytest

from capped import GiB, run_capped, one_line_refusal

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RLIMIT_AS as Linux enforces it")


def _import(tmp_path: Path, path: Path, *extra: str):
    home = tmp_path / "home"
    env = {**__import__("os").environ, "ADVISOR_HOME": str(home)}
    result = run_capped(["import", str(path), *extra], cap=GiB, timeout=60, env=env)
    return result, home / "sessions"


def _refused(tmp_path: Path, path: Path) -> str:
    result, sessions = _import(tmp_path, path)
    assert result.returncode in (2, 3), (result.returncode, result.stderr[-2000:])
    assert result.seconds < 60
    assert not sessions.exists() or not any(sessions.iterdir())  # no half-made session
    return one_line_refusal(result)


def _snapshot(frames: list) -> dict:
    return {"segments": [{"device": 0, "address": 0, "total_size": 2 << 20, "blocks": [
        {"address": 0, "size": 1 << 20, "state": "active_allocated", "frames": frames}]}],
        "device_traces": [[{"action": "alloc", "addr": 0, "size": 1 << 20, "frames": frames}]]}


def test_a_trace_naming_a_world_of_a_trillion_ranks_is_refused(tmp_path):
    path = tmp_path / "world.json"
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 10**12},
                                "traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0",
                                                 "pid": 1, "tid": 1, "ts": 0, "dur": 100}]}))
    assert path.stat().st_size < 700
    line = _refused(tmp_path, path)
    assert "1000000000000 ranks" in line and "65536" in line


def test_a_snapshot_whose_memo_repeats_a_list_into_a_huge_filename_imports_without_building_it(tmp_path):
    """pickle memoizes each list once: [L]*64 six levels deep is a few hundred bytes on disk and
    64**6 strings as text. The reader reads a frame's filename only if it is a string."""
    bomb: list = ["A" * 16]
    for _ in range(6):
        bomb = [bomb] * 64
    path = tmp_path / "memo.pickle"
    path.write_bytes(pickle.dumps(_snapshot([{"filename": bomb, "line": 1, "name": "forward"}]), protocol=4))
    assert path.stat().st_size < 1500
    result, sessions = _import(tmp_path, path, "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.seconds < 60 and result.max_rss_bytes < 300e6
    assert json.loads((tmp_path / "r.json").read_text())["summary"] is not None


def test_a_snapshot_whose_memo_repeats_blocks_past_any_real_count_is_refused(tmp_path):
    """10,000 references to one segment of 10,000 references to one block: 10^8 blocks to walk
    from a file of some tens of kilobytes."""
    block = {"address": 0, "size": 512, "state": "active_allocated", "frames": []}
    segment = {"device": 0, "total_size": 1 << 20, "blocks": [block] * 10_000}
    path = tmp_path / "blocks.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment] * 10_000}, protocol=4))
    assert "more items than the importer visits" in _refused(tmp_path, path)


def test_a_pickle_naming_a_huge_memo_slot_is_refused_before_the_unpickler_sizes_its_memo(tmp_path):
    path = tmp_path / "slot.pickle"
    path.write_bytes(b"\x80\x02}r\xff\xff\xff\x7f.")  # an empty dict put in memo slot 2^31 - 1
    assert "memo slot 2147483647" in _refused(tmp_path, path)


def _steps_trace(path: Path, steps: int) -> None:
    """A gzip'd trace of ``steps`` ProfilerStep spans, written as it is made (never whole in memory)."""
    with gzip.open(path, "wt", compresslevel=1) as handle:
        handle.write('{"schemaVersion": 1, "traceEvents": [')
        for i in range(steps):
            handle.write(("," if i else "") + f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{i}", '
                         f'"pid": 1, "tid": 1, "ts": {i * 10}, "dur": 9}}')
        handle.write("]}")


def test_a_trace_of_300000_steps_is_refused_with_memory_bounded(tmp_path):
    """Before, each step held ~1.7 KB to the end (3 million of them failed under a 4 GB cap)."""
    path = tmp_path / "steps.json.gz"
    _steps_trace(path, 300_000)
    result, sessions = _import(tmp_path, path)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "ProfilerStep spans" in one_line_refusal(result)
    assert result.seconds < 60
    assert not sessions.exists() or not any(sessions.iterdir())
    small = tmp_path / "small.json.gz"
    _steps_trace(small, 1_000)
    baseline, _ = _import(tmp_path, small, "--json", str(tmp_path / "r.json"))
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    # Reading stops at the limit (50,000 steps, about 340 bytes each while read: 17 MB measured
    # above the 1,000-step import), where 1.7 KB for each of 300,000 steps was 500 MB.
    print(f"max RSS: {result.max_rss_bytes / 1e6:.0f} MB refusing 300,000 steps, "
          f"{baseline.max_rss_bytes / 1e6:.0f} MB importing 1,000")
    assert result.max_rss_bytes - baseline.max_rss_bytes < 60e6, (result.max_rss_bytes, baseline.max_rss_bytes)


def test_a_valid_300_byte_snapshot_imports_under_the_cap(tmp_path):
    path = tmp_path / "small.pickle"
    path.write_bytes(pickle.dumps(_snapshot([{"filename": "train.py", "line": 3, "name": "forward"}])))
    assert path.stat().st_size < 400
    result, sessions = _import(tmp_path, path, "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(list(sessions.iterdir())) == 1
