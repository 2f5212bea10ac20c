"""apply/forward_patch.py, the instance-forward patch the checkpointing, offload and pipeline
appliers share: marks, restore newest first, and a forward replaced by someone else is left."""

from __future__ import annotations

import logging

import torch
from torch import nn

from advisor.apply.forward_patch import ForwardPatches, is_patched
from advisor.apply.remedies.activation_checkpointing import apply_activation_checkpointing
from advisor.apply.remedies.activation_offload import apply_activation_offload


def test_patch_and_restore_newest_first() -> None:
    lin = nn.Linear(2, 2)
    own = lin.forward  # a bound method: cannot carry a mark itself
    patches = ForwardPatches("__mark_a__", "test")
    patches.patch("lin", lin, own)
    assert is_patched(lin, "__mark_a__") and not is_patched(lin, "__mark_b__")
    x = torch.ones(1, 2)
    assert torch.equal(lin(x), nn.Linear.forward(lin, x))
    inner = ForwardPatches("__mark_a__", "test")
    inner.patch("lin", lin, lambda t: t * 0)
    inner.restore()
    patches.restore()
    assert "forward" not in lin.__dict__ and patches.names == ()


def test_a_forward_replaced_since_is_left_with_a_warning(caplog) -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    for apply, what in ((lambda: apply_activation_checkpointing(model, modules=["0"]), "checkpointing"),
                        (lambda: apply_activation_offload(model, modules=["0"], min_bytes=0), "activation offload")):
        handle = apply()
        theirs = lambda t: t  # noqa: E731  (another tool's patch, after ours)
        model[0].forward = theirs
        with caplog.at_level(logging.WARNING, logger="advisor.apply"):
            handle.revert()
        assert model[0].__dict__["forward"] is theirs
        assert f"Not reverting {what} of '0'" in caplog.text
        del model[0].forward
        caplog.clear()
