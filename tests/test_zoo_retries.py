"""The zoo runner's bare runs: a hang of the reference (torch's own, without the advisor) is run
again, sooner than an attached run's stall is called (zoo/conformance.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))

import conformance  # noqa: E402


class _Stop(Exception):
    """Raised at the attached run: the bare runs are what this test reads."""


def _runs(monkeypatch: pytest.MonkeyPatch, hangs: int, smoke: bool = True) -> list[tuple[str, int]]:
    calls: list[tuple[str, int]] = []

    def execute(entry, steps, home, kind, attach, *, timeout_s, verb="attach"):
        calls.append((kind, timeout_s))
        if kind != "bare":
            raise _Stop
        hung = sum(1 for k, _ in calls if k == "bare") <= hangs
        return conformance.Run(kind=kind, cmd=[], rc=None if hung else 0, stdout="", stderr="",
                               wall_s=float(timeout_s if hung else 1), timed_out=hung, report=None, artifacts={})

    monkeypatch.setattr(conformance, "execute", execute)
    with pytest.raises(_Stop):
        conformance.run_entry(conformance.BY_NAME["accelerate_accum"], home=Path("unused"), smoke=smoke)
    return calls


@pytest.mark.parametrize("smoke", [True, False])
def test_a_hung_bare_run_is_run_again_at_the_shorter_timeout(monkeypatch: pytest.MonkeyPatch, smoke: bool) -> None:
    calls = _runs(monkeypatch, hangs=2, smoke=smoke)
    entry = conformance.BY_NAME["accelerate_accum"]
    long = min(entry.timeout_s, conformance.SMOKE_TIMEOUT_S) if smoke else entry.timeout_s
    short = conformance.BARE_TIMEOUT_S
    assert short < long
    assert calls == [("bare", short)] * 3 + [("attach", long)]  # two hangs, a third run; the attached run's own limit


def test_bare_runs_stop_after_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _runs(monkeypatch, hangs=10)
    assert [k for k, _ in calls].count("bare") == 1 + conformance.BARE_RETRIES
