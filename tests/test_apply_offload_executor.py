"""The offload remedies through the executor: applied at a boundary, training unchanged; a failure
in the middle of an apply leaves nothing behind and training goes on."""

from __future__ import annotations

import gc

import pytest
from test_apply_executor import baseline, drive, events, setup

from advisor.apply.remedies import activation_offload
from advisor.records import host_memory
from recommendations import wire

OFFLOAD = wire("o1", "activation_offload", params={"modules": ["blocks.0", "blocks.2"], "checkpoint": ["blocks.1"],
                                                   "min_bytes": 0}, peak=1000, step_time_s=0.1)
OPTIMIZER = wire("o2", "optimizer_offload", params={"optimizers": None}, peak=1000, step_time_s=0.1)


@pytest.mark.parametrize("rec", [OFFLOAD, OPTIMIZER], ids=["activation", "optimizer"])
def test_applied_at_a_boundary_keeps_the_losses(rec) -> None:
    model, opt, ctx, ex = setup()
    ex.submit({"type": "apply", "recommendation": rec, "at_step": 3, "measure_steps": 2})
    losses, _ = drive(ctx, ex, model, opt, 9)
    assert losses == baseline(9)
    [result] = events(ctx, "apply_result")
    assert result.data["error"] is None and result.data["at_step"] == 3
    if rec is OFFLOAD:  # what autograd saved outside our hooks (the harness's peak) went down
        before, after = result.data["measured"]["before"], result.data["measured"]["after"]
        assert after["peak_memory_bytes"] < before["peak_memory_bytes"]


def test_failure_mid_apply_reverts_and_training_goes_on(monkeypatch) -> None:
    real = activation_offload.OffloadHandle.wrap
    calls = {"n": 0}

    def flaky(self, inner, name=""):
        calls["n"] += 1
        if calls["n"] == 2:  # the first module is already wrapped, and blocks.1 checkpointed
            raise RuntimeError("injected failure mid-apply")
        return real(self, inner, name)

    monkeypatch.setattr(activation_offload.OffloadHandle, "wrap", flaky)
    model, opt, ctx, ex = setup()
    gc.collect()  # earlier tests' remedies free their host buffers when collected, not before
    held = host_memory.held_bytes()  # (remedies kept by earlier tests of this process hold theirs)
    ex.submit({"type": "apply", "recommendation": OFFLOAD, "at_step": 2, "measure_steps": 1})
    losses, flags = drive(ctx, ex, model, opt, 6)
    assert losses == baseline(6) and not any(flags)
    [result] = events(ctx, "apply_result")
    assert "injected failure" in (result.data["error"] or "")
    assert not any("forward" in m.__dict__ for m in model.modules())
    gc.collect()
    assert host_memory.held_bytes() == held
