"""The op counter reuses an op's cost for a call of the same signature, and only then."""

from __future__ import annotations

import torch

from advisor.probes.compute import formulas
from advisor.probes.compute.counter import count_ops


def _expected(fn_calls):
    return [formulas.op_cost(f, args, {}, out).bytes for f, args, out in fn_calls]


def test_a_repeated_signature_costs_what_the_formulas_say_aliases_and_strides_included():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    row = torch.randn(1, 64).expand(64, 64)  # a zero stride: one row read

    def run():
        for _ in range(3):
            torch.mul(a, b)
            torch.mul(a, a)  # the same tensor twice: read once
            torch.mul(a, row)

    calls = count_ops(run)
    mul = torch.ops.aten.mul.Tensor
    expected = _expected([(mul, (a, b), a * b), (mul, (a, a), a * a), (mul, (a, row), a * row)]) * 3
    assert [c.bytes for c in calls] == expected
    assert len(set(expected)) == 3  # the three signatures cost differently
    assert {c.input_shapes for c in calls} == {((64, 64), (64, 64))}
