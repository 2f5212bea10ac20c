"""The zoo's smoke subset: every public training script of zoo/ for a few steps, bare against
``advisor attach``, one test per script and check (``test_zoo[dcgan-losses]``).

Each script runs twice per session (bare, then attached; zoo/conformance.py), the first of its
tests pays for both, and the others read the same result. A check that is n/a for a script (no
loss printed and no checkpoint; no report checker) is skipped with the reason. Known product
defects are strict xfails: each turns into a failure once its fix lands, so the mark must go with
the fix. The whole table with the ``--apply auto`` pass is ``python bench/zoo.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

for _module in ("transformers", "accelerate", "lightning", "datasets", "evaluate", "tokenizers"):
    pytest.importorskip(_module, reason="the zoo's scripts need the zoo extra: pip install -e '.[test,zoo]'")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))

import conformance  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# (entry, check) -> the product defect that fails it today.
KNOWN: dict[tuple[str, str], str] = {}

_ENTRIES = conformance.select(None, smoke=True)
_RESULTS: dict[str, conformance.EntryResult] = {}


def _params() -> list:
    params = []
    for entry in _ENTRIES:
        for check in conformance.CHECKS:
            reason = KNOWN.get((entry.name, check))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            params.append(pytest.param(entry.name, check, id=f"{entry.name}-{check}", marks=marks))
    return params


@pytest.fixture(scope="session")
def zoo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.mark.parametrize(("name", "check"), _params())
def test_zoo(name: str, check: str, zoo_home: Path) -> None:
    if name not in _RESULTS:
        _RESULTS[name] = conformance.run_entry(conformance.BY_NAME[name], home=zoo_home, smoke=True)
    result = _RESULTS[name].checks[check]
    if result.status == "n/a":
        pytest.skip(f"{name}: {check}: {result.reason}")
    assert result.status == "pass", f"{name}: {check}: {result.reason}"


def test_known_defects_name_real_checks() -> None:
    """Every xfail above names an entry of the smoke subset and one of its checks."""
    names = {entry.name for entry in _ENTRIES}
    assert all(name in names and check in conformance.CHECKS for name, check in KNOWN)
