"""A fit's random ops on host tensors leave the real generator where a real run leaves it."""

from __future__ import annotations

import pytest
import torch

import advisor.fit.draws as draws_module
from advisor.fit.tensors import FitTensorMode


def _after(fn) -> torch.Tensor:
    torch.manual_seed(0)
    fn()
    return torch.rand(8)  # the generator's state, read


def _fake(fn) -> torch.Tensor:
    mode = FitTensorMode(target=None, on_unrunnable=lambda func, exc, args: 0)
    torch.manual_seed(0)
    with mode:
        fn()
    return torch.rand(8)


@pytest.mark.parametrize("size", [16, 1000, 1003, 4096 + 7])
@pytest.mark.parametrize("op", ["normal_", "uniform_"])
def test_chunked_replays_draw_what_one_real_op_draws(monkeypatch, size: int, op: str) -> None:
    """Above the scratch limit ``normal_`` and ``uniform_`` are replayed in chunks; the generator
    ends where one op over the whole tensor leaves it (``normal_``'s tail of under 16 included)."""
    monkeypatch.setattr(draws_module, "SCRATCH_ELEMENTS", 8)
    monkeypatch.setattr(draws_module, "CHUNK", 64)
    for dtype in (torch.float32, torch.float64):
        real = _after(lambda: getattr(torch.empty(size, dtype=dtype), op)())
        assert torch.equal(_fake(lambda: getattr(torch.empty(size, dtype=dtype), op)()), real)


def test_a_models_init_is_replayed_once_and_other_large_ops_are_counted(monkeypatch) -> None:
    real = _after(lambda: torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 8)))
    mode = FitTensorMode(target=None, on_unrunnable=lambda func, exc, args: 0)
    torch.manual_seed(0)
    with mode:
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 8))
    assert torch.equal(torch.rand(8), real)
    assert mode.draws.replayed == 64 * 256 + 256 + 256 * 8 + 8  # each op once, not its decomposition too
    monkeypatch.setattr(draws_module, "SCRATCH_ELEMENTS", 8)
    with mode:
        torch.empty(100).bernoulli_(0.5)  # not chunkable: left, and said
    assert mode.draws.left == {"bernoulli_": 1}


def test_an_op_that_cannot_be_replayed_on_zeros_is_counted_not_raised() -> None:
    mode = FitTensorMode(target=None, on_unrunnable=lambda func, exc, args: 0)
    with mode:
        probabilities = torch.ones(4, 10)
        torch.multinomial(probabilities, 2)  # zeros are no distribution: its replay fails
    assert mode.draws.left.get("multinomial") == 1
