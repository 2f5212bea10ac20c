"""The delegating DDP communication hook and the gradient-compression remedy, in one gloo process.

A one-rank DDP still runs its reducer and the registered hook on every bucket, so the switch's
modes can be told apart by the gradients they leave: the default mode (torch's allreduce hook)
gives DDP's own gradients exactly; bf16 rounds them to bf16; a hook the script registers itself
is delegated to."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from advisor.agent.capture import Capture
from advisor.apply import comm_switch
from advisor.apply.remedies.grad_compression import apply_grad_compression
from advisor.apply.target import Target

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without distributed")


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    if not dist.is_initialized():
        store = tmp_path_factory.mktemp("pg") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


class FakeAgent:
    rank, step = 0, 0
    config = {"allow_inexact": True}  # the switch is installed for jobs that may change numerics

    def optimizer_created(self, opt) -> None:
        pass

    def emit(self, record) -> None:
        pass


@pytest.fixture
def captured():
    capture, undo = Capture(), []
    capture.install(FakeAgent(), undo.append)
    yield capture
    for fn in reversed(undo):
        fn()


def grads(ddp: torch.nn.Module) -> list[torch.Tensor]:
    ddp.zero_grad(set_to_none=True)
    x = torch.linspace(-1, 1, 32).reshape(4, 8) * 1.2345678
    ddp(x).pow(2).sum().backward()
    return [p.grad.clone() for p in ddp.parameters()]


def make() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def test_the_switch_is_installed_at_construction_and_changes_nothing_by_default(group, captured) -> None:
    reference = grads(make())  # the bare module: what one rank's all-reduce must give back
    ddp = DDP(make())
    switch = getattr(ddp, comm_switch.ATTRIBUTE)
    assert switch.mode == "default"
    assert all(torch.equal(a, b) for a, b in zip(grads(ddp), reference))


def test_compression_rounds_the_gradients_and_revert_restores(group, captured) -> None:
    ddp = DDP(make())
    exact = grads(ddp)
    handle = apply_grad_compression(Target(wrapped_models=[ddp], wrappers=[ddp]), dtype="bf16")
    compressed = grads(ddp)
    assert all(torch.equal(c, e.to(torch.bfloat16).float()) for c, e in zip(compressed, exact))
    assert any(not torch.equal(c, e) for c, e in zip(compressed, exact))
    with pytest.raises(ValueError, match="already"):
        apply_grad_compression(Target(wrapped_models=[ddp], wrappers=[ddp]), dtype="bf16")
    handle.revert()
    assert all(torch.equal(a, b) for a, b in zip(grads(ddp), exact))


def test_a_hook_the_script_registers_is_delegated_to(group, captured) -> None:
    ddp = DDP(make())
    calls = []

    def scaled(state, bucket):
        calls.append(state)
        bucket.buffer().mul_(2.0)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    exact = grads(ddp)
    ddp.register_comm_hook("mine", scaled)
    doubled = grads(ddp)
    assert calls and calls[0] == "mine"
    assert all(torch.allclose(d, 2 * e) for d, e in zip(doubled, exact))
    with pytest.raises(RuntimeError, match="once"):
        ddp.register_comm_hook("again", scaled)


def test_compression_needs_the_switch(group) -> None:
    ddp = DDP(make())  # built without the capture: no switch
    with pytest.raises(ValueError, match="delegating hook"):
        apply_grad_compression(Target(wrapped_models=[ddp], wrappers=[ddp]), dtype="bf16")
