"""The live in-process pipeline (apply/remedies/pipeline.py) on CPU stages: same losses, the
micro-batch order and the overlap of stages, refusals, revert, and a failure in the middle of applying."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

from advisor.apply.remedies import pipeline as pipeline_mod
from advisor.apply.remedies.pipeline import PipelineHandle, apply_pipeline
from pipeline_models import MLPChain, Target, train_chain, train_gpt

STAGES = [["blocks.0"], ["blocks.1", "blocks.2"], ["blocks.3"]]
M = 4


def _close(a: list[float], b: list[float], rel: float = 1e-5) -> None:
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) <= rel * abs(x), f"step {step}: {x!r} vs {y!r}"


def _apply_at(step: int, handles: list[PipelineHandle], **kw: Any):
    def at(i: int, target: Target) -> None:
        if i == step:
            handles.append(apply_pipeline(target, **{"stages": STAGES, "micro_batches": M,
                                                     "devices": ["cpu"] * 3, **kw}))
    return at


@pytest.fixture(scope="module")
def gpt_baseline() -> list[float]:
    return train_gpt(20)


def test_gpt_split_at_step_5_keeps_the_losses_and_pipelines(gpt_baseline: list[float]) -> None:
    handles: list[PipelineHandle] = []
    losses = train_gpt(20, _apply_at(5, handles))
    _close(gpt_baseline, losses)
    (h,) = handles
    assert h.mode == "pipeline" and h.refusal is None
    # Step 5's forward verifies block by block; the 14 after it are pipelined.
    assert h.pipelined_forwards == 14
    timeline = list(h.timeline)
    assert len(timeline) == 14 * 3 * M
    forwards = [timeline[i:i + 3 * M] for i in range(0, len(timeline), 3 * M)]
    for fwd in forwards:
        for stage in range(3):
            runs = sorted((start, end, mb) for s, mb, start, end in fwd if s == stage)
            assert [mb for _, _, mb in runs] == list(range(M))  # micro-batches in order on each stage
            assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:]))  # one at a time per stage
        ends = {(s, mb): end for s, mb, _, end in fwd}
        for s, mb, start, _ in fwd:
            if s > 0:
                assert start >= ends[(s - 1, mb)]  # a stage takes a micro-batch its predecessor finished


class _Meet(nn.Module):
    """A linear layer that, once armed, meets the other stage inside its forward on a given call."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.arm: tuple[int, threading.Event, threading.Event] | None = None
        self.calls = 0
        self.met = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.arm is not None:
            self.calls += 1
            on_call, mine, theirs = self.arm
            if self.calls == on_call:
                mine.set()
                self.met = theirs.wait(timeout=20)
        return self.lin(x)


def test_stages_overlap_in_time() -> None:
    # Stage 0 on micro-batch 1 and stage 1 on micro-batch 0 must run at the same time: each waits
    # inside its forward for the other to have started. One stage after the other would time out.
    model = nn.Sequential(_Meet(8), _Meet(8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = apply_pipeline(Target(model, opt), stages=[["0"], ["1"]], micro_batches=2, devices=["cpu", "cpu"])
    x = torch.randn(4, 8)
    model(x).sum().backward()  # the verifying forward
    assert h.mode == "pipeline"
    a, b = threading.Event(), threading.Event()
    model[0].arm, model[1].arm = (2, a, b), (1, b, a)
    model(x).sum().backward()
    assert model[0].met and model[1].met
    spans = {(s, mb): (start, end) for s, mb, start, end in h.timeline}
    (s0, e0), (s1, e1) = spans[(0, 1)], spans[(1, 0)]
    assert s0 < e1 and s1 < e0  # the two intervals overlap
    h.revert()


def test_batchnorm_is_refused_and_nothing_changes() -> None:
    model = MLPChain(norm=nn.BatchNorm1d(16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="blocks.1.2 is a BatchNorm1d"):
        apply_pipeline(Target(model, opt), stages=[["blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]],
                       micro_batches=2, devices=["cpu", "cpu"])
    assert all("forward" not in b.__dict__ for b in model.blocks)


@pytest.mark.parametrize("stages, message", [
    ([["blocks.0"], ["blocks.2"]], "not consecutive children"),
    ([["blocks.1"], ["blocks.0"]], "not consecutive children"),
    ([["blocks.0"], ["residual"]], "no block 'residual'"),
])
def test_not_a_chain_is_refused(stages: list[list[str]], message: str) -> None:
    model = MLPChain()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=message):
        apply_pipeline(Target(model, opt), stages=stages, micro_batches=2, devices=["cpu", "cpu"])


@pytest.mark.parametrize("kw, why", [
    ({"residual": True}, "do not feed each other"),
    ({"mix": True}, "changes when the batch is split"),
])
def test_refused_on_the_first_forward_keeps_training_exact(kw: dict[str, bool], why: str) -> None:
    base = train_chain(MLPChain(**kw), 8)
    handles: list[PipelineHandle] = []

    def at(i: int, target: Target) -> None:
        if i == 3:
            handles.append(apply_pipeline(target, stages=[["blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]],
                                          micro_batches=2, devices=["cpu", "cpu"]))

    losses = train_chain(MLPChain(**kw), 8, at)
    (h,) = handles
    assert h.mode == "sequential" and why in (h.refusal or "")
    assert h.pipelined_forwards == 0
    _close(base, losses, rel=1e-6)


def test_revert_restores_the_forwards_and_losses_stay_equal(gpt_baseline: list[float]) -> None:
    handles: list[PipelineHandle] = []
    apply = _apply_at(5, handles)
    params_before: list[tuple[int, torch.device]] = []

    def at(i: int, target: Target) -> None:
        if i == 5:
            params_before.extend((id(p), p.device) for p in target.models[0].parameters())
        apply(i, target)
        if i == 12:
            handles[0].revert()
            handles[0].revert()  # twice is harmless
            model = target.models[0]
            assert all("forward" not in b.__dict__ for b in model.blocks)
            assert [(id(p), p.device) for p in model.parameters()] == params_before
            # the optimizer still holds the model's own Parameter objects
            assert {id(p) for g in target.optimizers[0].param_groups for p in g["params"]} == \
                {i for i, _ in params_before}

    losses = train_gpt(20, at)
    _close(gpt_baseline, losses)
    assert handles[0].mode == "reverted" and handles[0].pipelined_forwards == 6


def test_failure_mid_apply_reverts_and_training_goes_on(gpt_baseline: list[float],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    real = pipeline_mod._move_module
    moved: list[nn.Module] = []

    def failing(handle: PipelineHandle, block: nn.Module, device: torch.device, states: Any) -> None:
        if len(moved) == 2:  # the third block's move fails: two blocks are already patched
            raise RuntimeError("injected: moving blocks.2 failed")
        moved.append(block)
        real(handle, block, device, states)

    monkeypatch.setattr(pipeline_mod, "_move_module", failing)
    errors: list[BaseException] = []

    def at(i: int, target: Target) -> None:
        if i == 5:
            try:
                apply_pipeline(target, stages=STAGES, micro_batches=M, devices=["cpu"] * 3)
            except RuntimeError as exc:
                errors.append(exc)
            assert all("forward" not in b.__dict__ for b in target.models[0].blocks)

    losses = train_gpt(20, at)
    assert len(errors) == 1 and "injected" in str(errors[0]) and len(moved) == 2
    assert losses == gpt_baseline  # nothing of the split survived: the run is bit-identical


def test_parameter_tied_outside_the_chain_is_refused() -> None:
    model = MLPChain()
    model.head = nn.Linear(16, 16)
    model.head.weight = model.blocks[3][0].weight  # tied, as an embedding and a head can be
    target = Target(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="outside the chain"):
        apply_pipeline(target, stages=[["blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]], micro_batches=2,
                       devices=["cpu", "cpu"])


def test_bad_params_are_refused() -> None:
    model = MLPChain()
    target = Target(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="two or more"):
        apply_pipeline(target, stages=[["blocks.0"]], micro_batches=2, devices=["cpu"])
    with pytest.raises(ValueError, match="one device per stage"):
        apply_pipeline(target, stages=[["blocks.0"], ["blocks.1"]], micro_batches=2, devices=["cpu"])
    with pytest.raises(ValueError, match="micro_batches"):
        apply_pipeline(target, stages=[["blocks.0"], ["blocks.1"]], micro_batches=0, devices=["cpu", "cpu"])
    with pytest.raises(ValueError, match="not visible"):
        apply_pipeline(target, stages=[["blocks.0"], ["blocks.1"]], micro_batches=2, devices=["cpu", "cuda:9"])
