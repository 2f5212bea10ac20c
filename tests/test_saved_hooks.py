"""The probes' saved-tensor hooks step aside for torch.func (advisor/probes/saved_hooks.py): a
script's ``torch.func.grad`` ran under python and died under attach at its first deep step."""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, jacrev

from advisor.probes import saved_hooks

_C = torch._C._autograd


def _counting():
    seen = []

    def pack(t):
        seen.append(t.shape)
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), seen


def _f(x):
    return (x.sin() * x).sum()


def test_torch_func_runs_under_the_probes_hooks_which_stay_on_for_the_rest_of_the_step():
    originals = (_C._saved_tensors_hooks_disable, _C._saved_tensors_hooks_enable)
    hooks, seen = _counting()
    saved_hooks.push(hooks)
    try:
        x = torch.randn(5)
        assert torch.equal(grad(_f)(x), x.sin() + x * x.cos())  # raised "don't yet support saved tensor hooks"
        assert jacrev(lambda v: v.sin())(x).shape == (5, 5)
        assert _C._top_saved_tensors_default_hooks(False)[0] is hooks.pack_hook  # back on top
        before = len(seen)
        y = torch.randn(3, requires_grad=True)
        (y.sin() * y).sum().backward()
        assert len(seen) > before  # and still seeing what autograd saves
    finally:
        saved_hooks.pop(hooks)
    assert _C._top_saved_tensors_default_hooks(False) is None
    assert (_C._saved_tensors_hooks_disable, _C._saved_tensors_hooks_enable) == originals  # unwrapped


def test_the_scripts_own_hooks_are_left_alone_so_torch_func_raises_as_under_python():
    ours, _ = _counting()
    theirs, _ = _counting()
    saved_hooks.push(ours)
    try:
        with theirs:
            with pytest.raises(RuntimeError, match="saved tensor hooks"):
                grad(_f)(torch.randn(3))
            assert _C._top_saved_tensors_default_hooks(False)[0] is theirs.pack_hook
        assert _C._top_saved_tensors_default_hooks(False)[0] is ours.pack_hook  # ours were put back
    finally:
        saved_hooks.pop(ours)
    assert _C._top_saved_tensors_default_hooks(False) is None


def test_hooks_popped_while_a_transform_has_them_aside_are_not_pushed_back():
    hooks, _ = _counting()
    saved_hooks.push(hooks)

    def inside(x):
        saved_hooks.pop(hooks)  # a step boundary inside the transform (the probe stops)
        return _f(x)

    grad(inside)(torch.randn(4))
    assert _C._top_saved_tensors_default_hooks(False) is None
    assert _C._saved_tensors_hooks_is_enabled()
