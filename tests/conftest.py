import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_VISIBLE = os.environ.get("CUDA_VISIBLE_DEVICES")  # as the user set it, for the gpu-marked tests
sys.path.insert(0, str(ROOT / "tests"))  # for `fakes`


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing entirely
        has_cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session", autouse=True)
def _private_home_for_the_session(tmp_path_factory):
    """Before any module- or session-scoped fixture runs: a session-wide private store, so a
    fixture that records a session (tests/test_closed_loop.py) never writes to the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ADVISOR_HOME", str(tmp_path_factory.mktemp("advisor-home")))
        # The unmarked suite is the CPU suite: the training scripts it launches pick CUDA when
        # they see it (--device auto), and its figures (budgets, losses, coverage) are CPU ones.
        # This process read the variable already (collection asked torch for CUDA), so only the
        # children see no GPU; `gpu`-marked tests get it back (below). docs/gpu-validation.md.
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        # One intra-op thread in every training process a test starts (torchrun already sets it
        # for several ranks per node). Tests compare losses across processes bit for bit, and
        # 2-thread MKL GEMMs were not reproducible run to run in full-suite runs: a plain torchrun
        # baseline, and an attach of a single process, each read one or two bits off at scattered
        # steps (never when run alone). One thread also spares the 2 cores OpenMP's spinning.
        patch.setenv("OMP_NUM_THREADS", "1")
        patch.setenv("MKL_NUM_THREADS", "1")
        yield


@pytest.fixture(autouse=True)
def _private_home(request, tmp_path, monkeypatch):
    """Sessions of a test land in its own folder, never in the user's."""
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "advisor-home"))
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if "gpu" in request.keywords:
        _give_the_gpus_back(monkeypatch)


def _give_the_gpus_back(patch: pytest.MonkeyPatch) -> None:
    if _VISIBLE is None:
        patch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        patch.setenv("CUDA_VISIBLE_DEVICES", _VISIBLE)


@pytest.fixture(scope="module")
def gpus_visible():
    """For a gpu test's module-scoped fixture, which runs before ``_private_home`` gives the
    device back to the test: the ranks it spawns see the GPUs (an H200 run's ZeRO baseline
    failed with "No CUDA GPUs are available" without it)."""
    with pytest.MonkeyPatch.context() as patch:
        _give_the_gpus_back(patch)
        yield


@pytest.fixture(autouse=True)
def _reports_are_consistent(request, tmp_path):
    """After each test, every JSON report it wrote under its ``tmp_path`` passes ``advisor check``
    (tests/checked.py): an end-to-end test fails on a report that contradicts itself."""
    yield
    if "inconsistent_report" in request.keywords:
        return
    from checked import check_folder

    broken = check_folder(tmp_path)
    if broken:
        pytest.fail("reports that contradict themselves (advisor check):\n" + "\n".join(broken), pytrace=False)
