"""A fit on the CPU gives oneDNN's RNN layer the workspace the real kernel keeps for backward."""

from __future__ import annotations

import torch

from advisor.fit.tensors import FitTensorMode


def _saved_bytes(run) -> int:
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(saved)


def _unrunnable(func, exc, args):
    raise exc


def test_an_lstm_forward_saves_as_much_under_the_fit_as_for_real() -> None:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 32, 2)
    x = torch.randn(35, 20, 32)
    real = _saved_bytes(lambda: lstm(x))
    mode = FitTensorMode(target=None, on_unrunnable=_unrunnable)
    with mode:
        fake = torch.nn.LSTM(32, 32, 2)
        fitted = _saved_bytes(lambda: fake(torch.empty(35, 20, 32)))
    # the workspace (every step's gates and states, 1.37 MB a layer here) is most of it
    assert fitted == real > 2 * 1_300_000
    with mode, torch.no_grad():  # evaluation: the kernel keeps no workspace, and neither does the fit
        fake(torch.empty(35, 20, 32))
