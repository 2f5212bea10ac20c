"""The one cache of measured figures (advisor/records/json_cache.py): owner-only, bounded,
replaced atomically, and never an error to read or to fail to write."""

from __future__ import annotations

import json
import os
import stat

from advisor.records.json_cache import JsonCache, cache_dir


def test_entries_round_trip_in_an_owner_only_file_under_the_advisor_home(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home"))
    cache = JsonCache("figures.json")
    assert cache_dir() == tmp_path / "home" and cache.load() == {}
    path = cache.put("cpu|x", {"peak": 1.5})
    assert path == tmp_path / "home" / "figures.json" and cache.get("cpu|x") == {"peak": 1.5}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["figures.json"]  # no temporary file left behind


def test_it_keeps_the_newest_entries_only(tmp_path) -> None:
    cache = JsonCache("c.json", path=tmp_path / "c.json", max_entries=3)
    for i in range(5):
        cache.put(f"k{i}", i)
    cache.put("k2", 22)  # rewritten: the newest again
    assert list(cache.load()) == ["k3", "k4", "k2"]
    assert json.loads((tmp_path / "c.json").read_text()) == {"k3": 3, "k4": 4, "k2": 22}


def test_a_damaged_cache_reads_empty_and_an_unwritable_one_is_skipped(tmp_path) -> None:
    path = tmp_path / "c.json"
    path.write_text("{not json")
    cache = JsonCache("c.json", path=path)
    assert cache.load() == {}
    path.write_text("[1, 2]")  # JSON, but not an object
    assert cache.load() == {}
    blocked = JsonCache("c.json", path=tmp_path / "file" / "c.json")
    (tmp_path / "file").write_text("a file where the folder should be")
    assert blocked.put("k", 1) is None and blocked.load() == {}
