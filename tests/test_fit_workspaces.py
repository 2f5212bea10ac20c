"""A fit on the CPU gives oneDNN's RNN layer the workspace the real kernel keeps for backward."""

from __future__ import annotations

import torch
from fakes import saved_bytes

from advisor.fit.tensors import FitTensorMode


def _unrunnable(func, exc, args):
    raise exc


def test_an_lstm_forward_saves_as_much_under_the_fit_as_for_real() -> None:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 32, 2)
    x = torch.randn(35, 20, 32)
    real = saved_bytes(lambda: lstm(x))
    mode = FitTensorMode(target=None, on_unrunnable=_unrunnable)
    with mode:
        fake = torch.nn.LSTM(32, 32, 2)
        fitted = saved_bytes(lambda: fake(torch.empty(35, 20, 32)))
    # the workspace (every step's gates and states, 1.37 MB a layer here) is most of it
    assert fitted == real > 2 * 1_300_000
    with mode, torch.no_grad():  # evaluation: the kernel keeps no workspace, and neither does the fit
        fake(torch.empty(35, 20, 32))


def test_a_reduced_loss_owns_the_storage_the_real_kernel_gives_it() -> None:
    """``mse_loss`` and ``smooth_l1_loss`` on the CPU return their 0-dim loss in the unreduced
    loss's storage; a fit sized it to its shape (4 bytes) and read a job that keeps its loss into
    the next step 124 bytes light (the zoo's regression). ``l1_loss`` keeps 4 bytes, for real and
    fitted."""
    import torch.nn.functional as F

    losses = (F.mse_loss, F.smooth_l1_loss, F.l1_loss)
    x, y = torch.randn(32, 1), torch.randn(32, 1)
    real = [loss(x, y).untyped_storage().nbytes() for loss in losses]
    assert real[:2] == [128, 128] and real[2] == 4
    with FitTensorMode(target=None, on_unrunnable=_unrunnable):
        a, b = torch.empty(32, 1), torch.empty(32, 1)
        fitted = [loss(a, b) for loss in losses]
        assert [t.shape for t in fitted] == [torch.Size([])] * 3
        assert [t.untyped_storage().nbytes() for t in fitted] == real
