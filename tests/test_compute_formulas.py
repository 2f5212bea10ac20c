"""FLOPs and bytes per op against analytic counts (formulas documented in probes/compute/formulas.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from advisor.probes.compute.counter import OpCall, count_ops

F32 = 4


def _only(calls: list[OpCall], name: str) -> OpCall:
    found = [c for c in calls if c.name == name]
    assert len(found) == 1, [c.name for c in calls]
    return found[0]


def _costly(calls: list[OpCall]) -> list[OpCall]:
    return [c for c in calls if c.bytes > 0]


def test_linear_with_bias_is_one_addmm_with_bias_flops() -> None:
    b, n_in, n_out = 8, 32, 16
    lin = torch.nn.Linear(n_in, n_out)
    x = torch.randn(b, n_in)
    calls = count_ops(lambda: lin(x))
    op = _only(_costly(calls), "aten.addmm")
    assert op.flops == 2 * b * n_in * n_out + b * n_out
    assert op.bytes == F32 * (n_out + b * n_in + n_in * n_out + b * n_out)
    assert _only(calls, "aten.t").bytes == 0  # the weight transpose is a view


def test_linear_without_bias() -> None:
    b, n_in, n_out = 8, 32, 16
    lin = torch.nn.Linear(n_in, n_out, bias=False)
    x = torch.randn(b, n_in)
    calls = _costly(count_ops(lambda: lin(x)))
    assert [c.name for c in calls] == ["aten.mm"]
    assert calls[0].flops == 2 * b * n_in * n_out
    assert calls[0].bytes == F32 * (b * n_in + n_in * n_out + b * n_out)


def test_conv2d() -> None:
    n, cin, cout, h, w, k = 2, 3, 8, 10, 10, 3
    conv = torch.nn.Conv2d(cin, cout, k, padding=1)
    x = torch.randn(n, cin, h, w)
    op = _only(count_ops(lambda: conv(x)), "aten.convolution")
    out = n * cout * h * w
    assert op.flops == 2 * out * cin * k * k + out
    assert op.bytes == F32 * (x.numel() + conv.weight.numel() + cout + out)


def test_batched_matmul() -> None:
    b, m, k, n = 3, 8, 16, 4
    x, y = torch.randn(b, m, k), torch.randn(b, k, n)
    op = _only(count_ops(lambda: torch.bmm(x, y)), "aten.bmm")
    assert op.flops == 2 * b * m * n * k
    assert op.bytes == F32 * b * (m * k + k * n + m * n)


def test_attention_forward_and_backward_on_cpu_are_counted() -> None:
    b, h, s, e = 2, 3, 16, 8
    q, k, v = (torch.randn(b, h, s, e, requires_grad=True) for _ in range(3))
    calls = count_ops(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
    fwd = _only(calls, "aten._scaled_dot_product_flash_attention_for_cpu")
    bwd = _only(calls, "aten._scaled_dot_product_flash_attention_for_cpu_backward")
    assert fwd.flops == 4 * b * h * s * s * e  # Q K^T and P V
    # Flash backward recomputes the scores Q K^T, then dV, dP, dQ and dK: five matmuls.
    assert bwd.flops == 10 * b * h * s * s * e
    # Reads q, k, v; writes the output and the fp32 logsumexp (b, h, s).
    assert fwd.bytes == F32 * (4 * b * h * s * e + b * h * s)


@pytest.mark.parametrize(("fn", "name", "per_element"), [
    (torch.relu, "aten.relu", 1),
    (F.gelu, "aten.gelu", 8),
    (lambda x: torch.softmax(x, dim=-1), "aten._softmax", 5),
])
def test_pointwise_and_softmax_per_element(fn, name, per_element) -> None:
    x = torch.randn(4, 6, 10)
    op = _only(count_ops(lambda: fn(x)), name)
    assert op.flops == per_element * x.numel()
    assert op.bytes == 2 * F32 * x.numel()  # read once, write once


def test_layer_norm_forward_and_backward() -> None:
    rows, d = 12, 16
    ln = torch.nn.LayerNorm(d)
    x = torch.randn(rows, d, requires_grad=True)
    calls = count_ops(lambda: ln(x).sum().backward())
    fwd = _only(calls, "aten.native_layer_norm")
    assert fwd.flops == 8 * rows * d
    # input, weight, bias read; output, mean and rstd (one per row each) written
    assert fwd.bytes == F32 * (rows * d + 2 * d + rows * d + 2 * rows)
    assert _only(calls, "aten.native_layer_norm_backward").flops == 10 * rows * d


def test_in_place_op_reads_and_writes_its_target_once() -> None:
    x, y = torch.randn(64), torch.randn(64)
    calls = count_ops(lambda: x.add_(y))
    op = _only(calls, "aten.add_")
    assert op.flops == 64
    assert op.bytes == F32 * (64 + 64 + 64)  # read x, read y, write x
    scaled = _only(count_ops(lambda: x.mul_(2.0)), "aten.mul_")
    assert scaled.bytes == F32 * 2 * 64


def test_broadcast_input_counts_its_distinct_elements() -> None:
    x, bias = torch.randn(32, 16), torch.randn(16)
    op = _only(count_ops(lambda: x + bias), "aten.add")
    assert op.bytes == F32 * (32 * 16 + 16 + 32 * 16)


def test_views_move_no_bytes() -> None:
    x = torch.randn(4, 6)
    calls = count_ops(lambda: (x.view(24), x.t(), x.transpose(0, 1), x[1:], x.unsqueeze(0)))
    assert calls and all(c.bytes == 0 and c.flops == 0 for c in calls)


def test_two_byte_matmul_intensity_on_meta() -> None:
    m, k, n = 4096, 1024, 2048
    a = torch.empty(m, k, dtype=torch.float16, device="meta")
    b = torch.empty(k, n, dtype=torch.float16, device="meta")
    op = _only(count_ops(lambda: a @ b), "aten.mm")
    assert op.dtype == "float16"
    assert op.flops / op.bytes == pytest.approx(m * n * k / (m * k + k * n + m * n), rel=0.01)


def test_cpu_lstm_kernel_counts_what_the_same_cell_unrolled_counts() -> None:
    """``nn.LSTM`` on CPU runs one fused oneDNN op per layer (``aten.mkldnn_rnn_layer``); its
    FLOPs must equal those of the same LSTM written as an ``LSTMCell`` loop, whose matmuls and
    gates the counter sees one by one."""
    torch.manual_seed(0)
    lstm, cell = torch.nn.LSTM(32, 64), torch.nn.LSTMCell(32, 64)
    x = torch.randn(10, 4, 32)

    def fused() -> None:
        out, _ = lstm(x)
        out.sum().backward()

    calls = count_ops(fused)
    forward = [c for c in calls if c.name == "aten.mkldnn_rnn_layer"]
    backward = [c for c in calls if c.name == "aten.mkldnn_rnn_layer_backward"]
    if not forward:
        pytest.skip("this build runs CPU LSTMs without oneDNN")
    unrolled = count_ops(lambda: [cell(x[t]) for t in range(10)])
    assert sum(c.flops for c in forward) == sum(c.flops for c in unrolled) > 0
    cell_backward = count_ops(lambda: torch.stack([cell(x[t])[0] for t in range(10)]).sum().backward(),
                              phase="backward")
    matmuls = sum(c.flops for c in cell_backward if c.name == "aten.mm")
    assert backward and 0 < matmuls <= sum(c.flops for c in backward) <= 2 * sum(c.flops for c in forward)


def test_the_nll_loss_reads_one_log_probability_per_target_not_its_whole_input() -> None:
    """Charged for its whole [N, vocab] input, nanoGPT's loss read 122x its roof (issue 30)."""
    n, vocab = 64, 1000
    logp = torch.randn(n, vocab).log_softmax(-1).requires_grad_()
    target = torch.randint(0, vocab, (n,))
    calls = count_ops(lambda: F.nll_loss(logp, target).backward())
    forward = _only(calls, "aten.nll_loss_forward")
    assert forward.bytes == F32 * n + 8 * n + 2 * F32  # the picked entries, the targets, loss and total weight
    backward = _only(calls, "aten.nll_loss_backward")
    assert backward.bytes == F32 * n * vocab + 8 * n + 2 * F32  # writes its whole gradient, reads the targets
