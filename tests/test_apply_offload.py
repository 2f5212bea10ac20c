"""Activation and optimizer-state offload on CPU: exact losses applied live at step 5 of
examples/gpt.py's model, exact revert, tracked bytes move by the predicted amount, atomic apply."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from advisor.apply.remedies.activation_offload import apply_activation_offload, is_offloaded
from advisor.apply.remedies.optimizer_offload import apply_optimizer_offload
from advisor.apply.target import Target
from advisor.probes.memory.tracker import StorageTracker
from advisor.records import host_memory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, GPTConfig  # noqa: E402

STEPS, APPLY_AT, BATCH = 20, 5, 4
CFG = GPTConfig(vocab=128, seq=32, layers=4, hidden=64, heads=4)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make() -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(CFG)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randint(0, CFG.vocab, (BATCH, CFG.seq), generator=g),
            torch.randint(0, CFG.vocab, (BATCH, CFG.seq), generator=g))


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    loss = F.cross_entropy(model(x).view(-1, CFG.vocab), y.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def train(at_boundary: Callable[[int, GPT, torch.optim.Optimizer], None] | None = None
          ) -> tuple[list[float], GPT, torch.optim.Optimizer]:
    model, opt = make()
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(STEPS):
        if at_boundary is not None:
            at_boundary(i, model, opt)
        losses.append(step(model, opt, *batch(g)))
    return losses, model, opt


@pytest.fixture(scope="module")
def baseline(_one_thread) -> tuple[list[float], dict[str, torch.Tensor]]:
    losses, model, _ = train()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def test_activation_offload_live_at_step_5_is_bit_exact_and_reverts(baseline) -> None:
    handles = []

    def at(i: int, model: GPT, opt: torch.optim.Optimizer) -> None:
        if i == APPLY_AT:
            handles.append(apply_activation_offload(Target.of(model, [opt]), modules=["blocks.0", "blocks.2"],
                                                    min_bytes=0))
            assert is_offloaded(model.blocks[0]) and not is_offloaded(model.blocks[1])
        if i in (8, 14):  # steady state: one slab chunk, the same one, no allocation per tensor
            slabs.append(list(handles[0].slab.chunks))
        if i == 15:
            assert handles[0].offloaded_bytes > 0 and host_memory.held_bytes() >= handles[0].slab.nbytes > 0
            handles[0].revert()

    slabs: list = []
    losses, model, _ = train(at)
    assert len(slabs[0]) == len(slabs[1]) == 1 and slabs[0][0] is slabs[1][0]
    assert losses == baseline[0]  # all 20, bit for bit
    assert all("forward" not in b.__dict__ for b in model.blocks)
    assert all(torch.equal(v, baseline[1][k]) for k, v in model.state_dict().items())
    assert handles[0].live == 0 and handles[0].slab.nbytes == 0  # slab freed after revert


def test_optimizer_offload_live_at_step_5_is_bit_exact_and_reverts(baseline) -> None:
    handles = []

    def at(i: int, model: GPT, opt: torch.optim.Optimizer) -> None:
        if i == APPLY_AT:
            held.append(host_memory.held_bytes())  # remedies other tests kept hold theirs
            handles.append(apply_optimizer_offload(Target.of(model, [opt])))
            host = {id(t) for t in handles[0].placements[0].host.values()}
            assert all(id(v) in host for st in opt.state.values() for k, v in st.items() if k != "step")
        if i == 15:
            handles[0].revert()
            assert host_memory.held_bytes() == held[0]

    held: list[int] = []
    losses, model, opt = train(at)
    assert losses == baseline[0]
    assert all(torch.equal(v, baseline[1][k]) for k, v in model.state_dict().items())
    assert opt._optimizer_step_pre_hooks == {} and opt._optimizer_step_post_hooks == {}


def _saved_in(model: GPT, names: list[str], x: torch.Tensor) -> int:
    """Prediction: unique non-parameter bytes autograd saves inside the named modules (the
    per-module activation bytes the memory model uses)."""
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, int] = {}
    handles = []
    for name in names:
        module = model.get_submodule(name)

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = t.untyped_storage()._cdata
            if key not in params:
                seen[key] = t.untyped_storage().nbytes()
            return t

        def pre(m, a, pack=pack):
            ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            ctx.__enter__()
            m._ctx = ctx

        def post(m, a, o):
            m._ctx.__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    out = model(x)
    for h in handles:
        h.remove()
    del out
    return sum(seen.values())


def _tracked_after_forward(model: GPT, x: torch.Tensor) -> dict[str, int]:
    tracker = StorageTracker(device_type="cpu")
    tracker.start()
    try:
        tracker.refresh_roles([model], [])  # saved weights count as parameters, as in the agent
        tracker.set_step(1)
        tracker.phase = "forward"
        out = model(x)
        totals = dict(tracker.totals)
        out.sum().backward()
    finally:
        tracker.stop()
    return totals


def test_tracked_activation_bytes_drop_by_the_prediction() -> None:
    model, _ = make()
    x, _ = batch(torch.Generator().manual_seed(3))
    names = ["blocks.0", "blocks.1", "blocks.2"]
    predicted = _saved_in(model, names, x)
    before = _tracked_after_forward(model, x)
    handle = apply_activation_offload(model, modules=names, min_bytes=0)
    after = _tracked_after_forward(model, x)
    handle.revert()
    drop = before["activation"] - after["activation"]
    assert predicted > 0 and abs(drop - predicted) <= 0.05 * predicted, (drop, predicted)
    assert after["offloaded_host"] >= predicted  # the slab, in its own category
    assert before["offloaded_host"] == 0


def test_tracked_optimizer_state_moves_to_offloaded_host() -> None:
    model, opt = make()
    g = torch.Generator().manual_seed(3)
    step(model, opt, *batch(g))
    predicted = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                    if torch.is_tensor(v) and v.dim() > 0)
    handle = apply_optimizer_offload(Target.of(model, [opt]))
    step(model, opt, *batch(g))
    tracker = StorageTracker(device_type="cpu")
    tracker.start()
    try:
        tracker.refresh_roles([model], [opt])
        totals = dict(tracker.totals)
        tracker.budget_bytes = tracker.device_total()  # the host copies are not a device budget's
        torch.empty(0)  # allocates nothing: no budget error
    finally:
        tracker.stop()
    handle.revert()
    steps = sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items() if k == "step")
    assert abs(totals["optimizer_state"] - steps) <= 0.05 * predicted  # only the scalar counters stayed
    assert abs(totals["offloaded_host"] - predicted) <= 0.05 * predicted


def test_last_block_is_refused_and_bad_input_changes_nothing() -> None:
    model, _ = make()
    with pytest.raises(ValueError, match="last block before the loss"):
        apply_activation_offload(model, modules=["blocks.0", "blocks.3"])
    with pytest.raises(ValueError, match="min_bytes"):
        apply_activation_offload(model, modules=["blocks.0"], min_bytes=-1)
    assert not any("forward" in m.__dict__ for m in model.modules())
    with pytest.raises(ValueError, match="no optimizer"):
        apply_optimizer_offload(model)


def test_failure_mid_apply_reverts_and_training_goes_on(baseline, monkeypatch) -> None:
    """An optimizer whose state cannot move (the second of two) fails the apply after the first
    moved: the first is restored, and the run continues with unchanged losses."""
    import advisor.apply.remedies.optimizer_offload as mod

    calls = {"n": 0}
    real = mod._Placement.to_host

    def flaky(self):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected: host allocation failed")
        return real(self)

    def at(i: int, model: GPT, opt: torch.optim.Optimizer) -> None:
        if i == APPLY_AT:
            held = host_memory.held_bytes()
            monkeypatch.setattr(mod._Placement, "to_host", flaky)
            with pytest.raises(RuntimeError, match="injected"):
                apply_optimizer_offload(Target(wrapped_models=[model], optimizers=[opt, _Second(opt)]))
            monkeypatch.setattr(mod._Placement, "to_host", real)
            assert host_memory.held_bytes() == held
            assert opt._optimizer_step_pre_hooks == {} and opt._optimizer_step_post_hooks == {}
            assert all(v.device.type == "cpu" and not host_memory.is_offloaded(v.untyped_storage()._cdata)
                       for st in opt.state.values() for v in st.values())

    losses, _, _ = train(at)
    assert losses == baseline[0]


class _Second(torch.optim.SGD):
    """A second optimizer over the same parameters (never stepped), to fail on."""

    def __init__(self, first: torch.optim.Optimizer) -> None:
        super().__init__([p for g in first.param_groups for p in g["params"]], lr=0.0)


def tracked_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 budget: int | None = None) -> StorageTracker:
    """One training step under the CPU storage tracker (stopped again); its figures."""
    tracker = StorageTracker(device_type="cpu", budget_bytes=budget)
    tracker.start()
    try:
        tracker.refresh_roles([model], [opt])
        tracker.set_step(1)
        tracker.phase = "forward"
        step(model, opt, x, y)
        return tracker
    finally:
        tracker.stop()


def test_enforced_budget_counts_device_bytes_only() -> None:
    """Under a CPU budget just above the offloaded run's device peak, the run fits although
    device + host bytes do not; the unmodified run goes over it (the OOM path still works)."""
    model, opt = make()
    x, y = batch(torch.Generator().manual_seed(3))

    def peak(budget: int | None) -> tuple[int, int]:
        tracker = tracked_step(model, opt, x, y, budget)
        # The peak is the device's (the step's peak_memory_bytes); host copies beside it
        return tracker.peak_total, tracker.peak_total + tracker.peak_categories["offloaded_host"]

    step(model, opt, x, y)  # optimizer state exists
    base_device, _ = peak(None)
    handle = apply_activation_offload(model, modules=["blocks.0", "blocks.1", "blocks.2"], min_bytes=0)
    step(model, opt, x, y)  # the slab reaches its steady size
    device, total = peak(None)
    assert device < base_device and total > device
    budget = (device + base_device) // 2
    assert peak(budget)[0] <= budget  # no OutOfMemoryError: host copies are not counted
    handle.revert()
    with pytest.raises(torch.OutOfMemoryError, match="budget exceeded"):
        peak(budget)


def test_optimizer_offload_chunked_step_is_bit_exact_and_fires_the_hooks_once(baseline, monkeypatch) -> None:
    """Small chunks: every step runs in several chunks (copies of one beside the step of another on
    CUDA), the losses stay bit-equal, the groups are whole again after each step, the global step
    hooks (the agent's) fire once per step, and between steps all the state is on the host."""
    import advisor.apply.remedies.optimizer_offload as mod

    monkeypatch.setattr(mod, "CHUNK_BYTES", 64 << 10)
    calls: list[str] = []
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    pre = register_optimizer_step_pre_hook(lambda o, a, k: calls.append("pre"))
    post = register_optimizer_step_post_hook(lambda o, a, k: calls.append("post"))
    handles: list = []
    groups: list = []

    def at(i: int, model: GPT, opt: torch.optim.Optimizer) -> None:
        if i == APPLY_AT:
            groups.append([list(g["params"]) for g in opt.param_groups])
            handles.append(apply_optimizer_offload(Target.of(model, [opt])))
            calls.clear()
        if APPLY_AT < i < 15:
            placement = handles[0].placements[0]
            assert placement.chunks_run > 3
            assert [list(g["params"]) for g in opt.param_groups] == groups[0]
            host = {id(t) for t in placement.host.values()}
            assert all(id(v) in host for st in opt.state.values() for k, v in st.items() if k != "step")
        if i == 15:
            assert calls == ["pre", "post"] * (15 - APPLY_AT)
            handles[0].revert()

    try:
        losses, model, opt = train(at)
    finally:
        pre.remove()
        post.remove()
    assert losses == baseline[0]
    assert all(torch.equal(v, baseline[1][k]) for k, v in model.state_dict().items())
    assert opt._optimizer_step_pre_hooks == {} and opt._optimizer_step_post_hooks == {}


def test_the_first_offloaded_step_has_no_phantom_device_peak() -> None:
    """The first step after the apply grows the host slab in chunks and joins them into one at the
    end of backward; the old chunks are host memory until freed, so that step's device peak is
    the steady steps' (it was the slab's size higher: the executor measured it and reverted)."""
    model, opt = make()
    x, y = batch(torch.Generator().manual_seed(3))

    def device_peak() -> int:
        return tracked_step(model, opt, x, y).peak_total

    step(model, opt, x, y)  # optimizer state exists
    handle = apply_activation_offload(model, modules=["blocks.0", "blocks.1", "blocks.2"], min_bytes=0)
    try:
        first = device_peak()
        assert len(handle.slab.chunks) == 1 and handle.slab.high_water > 0  # grown in chunks, then joined
        steady = device_peak()
        assert first == steady
    finally:
        handle.revert()
