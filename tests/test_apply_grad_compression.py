"""The delegating DDP communication hook and the gradient-compression remedy, in one gloo process.

A one-rank DDP still runs its reducer and the registered hook on every bucket, so the switch's
modes can be told apart by the gradients they leave: the default mode gives DDP's own gradients
exactly; bf16 rounds them to bf16; a hook the script registers itself (or a torch built-in one) is
delegated to. The switch is installed on every DDP object, whether or not the job may change
numerics: consent (``--allow-inexact`` or the TUI's confirmation) is asked when compression is
applied, and may come after DDP is built. On 3 gloo ranks the default mode is bit-identical to
DDP without a hook, where torch's own ``allreduce_hook`` is not."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fakes import FakeContext
from recommendations import recommendation
from torch.nn.parallel import DistributedDataParallel as DDP

from advisor.agent.capture import Capture
from advisor.apply import comm_switch
from advisor.apply.executor import Executor
from advisor.apply.remedies.grad_compression import apply_grad_compression
from advisor.apply.target import Target
from advisor.records.commands import ApplyCommand
from advisor.records.samples import StepSample
from advisor.records.settings import AgentSettings

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without distributed")


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    if not dist.is_initialized():
        store = tmp_path_factory.mktemp("pg") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _install(capture: Capture, undo: list, *, comm_switch_on: bool) -> None:
    # No allow_inexact anywhere: the switch is installed all the same.
    capture.install(undo.append, on_optimizer=lambda opt: None, notify=lambda name, data: None,
                    comm_switch_on=comm_switch_on)


@pytest.fixture
def captured():
    capture, undo = Capture(), []
    _install(capture, undo, comm_switch_on=True)
    yield capture
    for fn in reversed(undo):
        fn()


@pytest.fixture
def opted_out():
    capture, undo = Capture(), []
    _install(capture, undo, comm_switch_on=False)
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


def test_a_builtin_hook_the_script_registers_is_delegated_to(group, captured) -> None:
    ddp = DDP(make())
    exact = grads(ddp)
    ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    assert getattr(ddp, comm_switch.ATTRIBUTE).user is not None
    halved = grads(ddp)
    assert all(torch.equal(h, e.half().float()) for h, e in zip(halved, exact))


def test_config_comm_switch_false_leaves_ddp_alone(group, opted_out) -> None:
    ddp = DDP(make())
    assert getattr(ddp, comm_switch.ATTRIBUTE, None) is None
    with pytest.raises(ValueError, match="delegating hook"):
        apply_grad_compression(Target(wrapped_models=[ddp], wrappers=[ddp]), dtype="bf16")


def _three_ranks(rank: int, port: int, out: str) -> None:
    import json
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=3)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    got = {}
    for name in ("bare", "switch", "torch_allreduce_hook"):
        torch.manual_seed(0)
        ddp = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8)))
        if name == "switch":
            comm_switch.install(ddp)
        elif name == "torch_allreduce_hook":
            ddp.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
        ddp(torch.randn(32, 64, generator=torch.Generator().manual_seed(rank))).pow(2).sum().backward()
        got[name] = [p.grad.clone() for p in ddp.parameters()]
    differ = {k: sum(int((a != b).sum()) for a, b in zip(got["bare"], got[k])) for k in got}
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(differ, f)


@pytest.mark.slow
def test_the_default_mode_is_ddps_own_arithmetic_on_three_ranks(tmp_path) -> None:
    import json

    from ranks import free_port, spawn_ranks

    results = [tmp_path / f"rank{r}.json" for r in range(3)]
    spawn_ranks(_three_ranks, (free_port(), str(tmp_path)), 3, results)
    for path in results:
        differ = json.loads(path.read_text())
        assert differ["switch"] == 0  # bit-identical to DDP without a hook
        assert differ["torch_allreduce_hook"] > 0  # what the switch did before: 1/3 by division


def test_the_tuis_confirmation_is_enough_consent_without_allow_inexact(group, captured) -> None:
    """The switch exists though the job was attached without --allow-inexact, so a confirmed
    command (the TUI's dialog) compresses; an unconfirmed one is refused."""
    ddp = DDP(make())
    exact = grads(ddp)

    class Ctx(FakeContext):
        def target(self) -> Target:
            return Target(wrapped_models=[ddp], wrappers=[ddp])

    rec = recommendation("grad-compression", "grad_compression", params={"dtype": "bf16"}, apply_class="live-opt-in")
    outcomes: list[str] = []
    for confirmed in (False, True):
        ctx = Ctx([ddp], settings=AgentSettings())  # attached without --allow-inexact
        ex = Executor(ctx)
        ex.submit(ApplyCommand(recommendation=rec, at_step=1, measure_steps=1, confirmed=confirmed))
        for i in range(2):
            ctx.step = i
            ex.on_boundary(i)
            ex.on_step_end(StepSample(index=i, time_s=0.1))
        outcomes.append(ex.results[0].status if ex.results else "pending")
    assert outcomes[0] == "failed"
    assert getattr(ddp, comm_switch.ATTRIBUTE).mode == "bf16"
    assert all(torch.equal(c, e.to(torch.bfloat16).float()) for c, e in zip(grads(ddp), exact))
