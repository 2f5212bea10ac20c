"""A session whose metadata has the wrong types (copied, edited, damaged): exit 3 naming the file
and the key, and ``advisor sessions`` still lists every other session. Before, ``ranks_hosted: 5``
or ``created: "yesterday"`` was a traceback, and one such session broke the listing for all."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest
from rich.console import Console

from advisor.cli import main
from advisor.listing import print_sessions
from advisor.paths import DB_NAME, new_session_dir
from advisor.records.samples import StepSample
from advisor.store import SessionStore


def _session(**meta) -> Path:
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, script="t.py", created=1.0e9, nproc_per_node=1, finished=True,
                   exit_code=0, exit_reason="completed", job={"id": "j", "launcher": "single", "ranks_hosted": [0]})
    store.put(StepSample(index=0, time_s=0.1))
    store.close()
    db = folder / DB_NAME
    with sqlite3.connect(db) as conn:  # as an edit or a damaged copy would leave it
        conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                         [(k, json.dumps(v)) for k, v in meta.items()])
    conn.close()
    return db


@pytest.mark.parametrize("meta, key", [
    ({"job": {"id": "j", "launcher": "single", "ranks_hosted": 5}}, "job.ranks_hosted"),
    ({"created": "yesterday"}, "created"),
    ({"nproc_per_node": [1]}, "nproc_per_node"),
    ({"exit_code": 2**80}, "exit_code"),
    ({"job": {"id": "j", "launcher": "single", "ranks_hosted": [0], "world_size": "2"}}, "job.world_size"),
])
def test_wrong_typed_metadata_is_exit_3_naming_the_file_and_never_breaks_the_listing(meta, key, capsys, tmp_path):
    good = _session()
    bad = _session(**meta)
    assert main(["report", str(bad)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(bad) in err and f"metadata {key} is" in err, err
    assert err.startswith("advisor: error: ") and len(err.strip().splitlines()) == 2  # the error and its hint
    out = io.StringIO()
    assert print_sessions(Console(file=out, width=400)) == 0
    rows = {line.split("│")[1].strip(): line for line in out.getvalue().splitlines() if line.count("│") > 2}
    assert "exit 0: completed" in rows[good.parent.name]
    assert f"unreadable: its metadata {key} is" in rows[bad.parent.name]
    assert main(["report", str(good), "--json", str(tmp_path / "r.json")]) == 0
