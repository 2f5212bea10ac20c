"""apply_activation_checkpointing: exact numerics, same objects and names, real recomputation, revert."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from advisor.apply.remedies.activation_checkpointing import apply_activation_checkpointing, is_checkpointed

@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: intra-op threads only add contention (several test runs share 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


VOCAB, DIM, HEADS, SEQ, BATCH, LAYERS = 32, 32, 4, 16, 4, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        # Dropout on purpose: recomputation must replay the same mask (RNG state preserved).
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM), nn.Dropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make(seed: int = 0) -> tuple[TinyGPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = TinyGPT()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
             torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)) for _ in range(n)]


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int,
          at_boundary: Callable[[int], None] | None = None, seed: int = 7) -> list[float]:
    """Plain training loop; ``at_boundary(i)`` runs before step i (after step i-1's optimizer step)."""
    torch.manual_seed(seed)  # dropout stream
    losses = []
    for i, (x, y) in enumerate(batches(steps)):
        if at_boundary is not None:
            at_boundary(i)
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def saved_tensor_count(model: nn.Module) -> tuple[int, int]:
    """(count, bytes) of tensors autograd saves outside checkpointed regions for one forward."""
    count = nbytes = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count, nbytes
        count += 1
        nbytes += t.numel() * t.element_size()
        return t

    x, y = batches(1)[0]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
    loss.backward()
    return count, nbytes


def test_losses_bit_identical_same_objects_and_revert() -> None:
    base_model, base_opt = make()
    baseline = train(base_model, base_opt, 8)

    model, opt = make()
    param_ids = [id(p) for g in opt.param_groups for p in g["params"]]
    names = [n for n, _ in model.named_parameters()]
    keys = list(model.state_dict())
    handles = []

    def at_boundary(i: int) -> None:
        if i == 3:  # after 3 steps
            handles.append(apply_activation_checkpointing(model, modules=["blocks.0", "blocks.2"]))
            assert is_checkpointed(model.blocks[0]) and is_checkpointed(model.blocks[2])
            assert not is_checkpointed(model.blocks[1])
            assert [n for n, _ in model.named_parameters()] == names
            assert list(model.state_dict()) == keys
            assert [id(p) for p in model.parameters()] == param_ids
        if i == 6:
            handles[0].revert()

    losses = train(model, opt, 8, at_boundary)
    assert losses == baseline  # bit-identical, not approximately
    assert [id(p) for g in opt.param_groups for p in g["params"]] == param_ids
    assert all(p is q for p, q in zip(opt.param_groups[0]["params"], model.parameters()))
    for block in model.blocks:
        assert "forward" not in block.__dict__
        assert block.forward.__func__ is Block.forward
    for (n1, p1), (n2, p2) in zip(base_model.named_parameters(), model.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)


def test_backward_recomputes_exactly_the_checkpointed_forwards() -> None:
    """torchtitan's check: extra backward FLOPs == forward FLOPs of the checkpointed blocks."""
    x, y = batches(1)[0]

    def flops(model: nn.Module) -> int:
        with FlopCounterMode(display=False) as counter:
            F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1)).backward()
        return counter.get_total_flops()

    model, _ = make()
    with FlopCounterMode(display=False) as forward_only:
        model(x)
    counts = forward_only.get_flop_counts()
    block_fwd = sum(sum(counts[f"TinyGPT.blocks.{i}"].values()) for i in (0, 2))
    plain = flops(model)
    handle = apply_activation_checkpointing(model, modules=["blocks.0", "blocks.2"])
    assert block_fwd > 0
    assert flops(model) - plain == block_fwd
    handle.revert()
    assert flops(model) == plain


def test_saved_tensors_shrink() -> None:
    model, _ = make()
    count, nbytes = saved_tensor_count(model)
    handle = apply_activation_checkpointing(model, modules=["blocks.0", "blocks.2"])
    count_ckpt, nbytes_ckpt = saved_tensor_count(model)
    assert count_ckpt < count and nbytes_ckpt < nbytes
    handle.revert()
    assert saved_tensor_count(model) == (count, nbytes)


def test_bad_names_list_valid_options() -> None:
    model, _ = make()
    with pytest.raises(ValueError, match=r"blocks\.1") as info:
        apply_activation_checkpointing(model, modules=["blocks.9"])
    assert "close names" in str(info.value)
    with pytest.raises(ValueError, match="valid names"):
        apply_activation_checkpointing(model, modules=["zzzzzz"])
    with pytest.raises(ValueError, match="overlap"):
        apply_activation_checkpointing(model, modules=["blocks.0", "blocks.0.mlp"])
    with pytest.raises(ValueError, match="empty"):
        apply_activation_checkpointing(model, modules=[])
    with pytest.raises(ValueError, match="list of names"):
        apply_activation_checkpointing(model, modules="blocks.0")
    assert not any("forward" in m.__dict__ for m in model.modules())  # nothing half-applied


def test_idempotence_is_a_clear_error() -> None:
    model, _ = make()
    handle = apply_activation_checkpointing(model, modules=["blocks.0"])
    with pytest.raises(ValueError, match="already checkpointed"):
        apply_activation_checkpointing(model, modules=["blocks.1", "blocks.0"])
    assert not is_checkpointed(model.blocks[1])  # atomic: the valid name was not applied either
    with pytest.raises(ValueError, match="already checkpointed"):
        apply_activation_checkpointing(model, modules=["blocks.0.mlp"])
    with pytest.raises(ValueError, match="contains checkpointed"):
        apply_activation_checkpointing(model, modules=["blocks"])
    handle.revert()
    handle.revert()  # twice is harmless
    apply_activation_checkpointing(model, modules=["blocks.0"]).revert()


def test_module_hooks_still_run_once_and_existing_instance_forward_restored() -> None:
    model, opt = make()
    calls = {"pre": 0, "fwd": 0, "bwd": 0, "inner": 0}
    block = model.blocks[1]

    def pre(mod: nn.Module, args: tuple) -> None:
        calls["pre"] += 1

    def post(mod: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        calls["fwd"] += 1
        return out * 0.5  # a hook that changes the output must keep doing so

    def bwd(mod: nn.Module, gin: tuple, gout: tuple) -> None:
        calls["bwd"] += 1

    block.register_forward_pre_hook(pre)
    block.register_forward_hook(post)
    block.register_full_backward_hook(bwd)
    block.qkv.register_forward_hook(lambda m, a, o: calls.__setitem__("inner", calls["inner"] + 1))
    base_model, base_opt = make()
    base_block = base_model.blocks[1]
    base_block.register_forward_hook(lambda m, a, o: o * 0.5)
    baseline = train(base_model, base_opt, 2)

    # A forward the user had already patched on the instance must come back as that same object.
    user_forward = block.forward
    block.forward = user_forward
    handle = apply_activation_checkpointing(model, modules=["blocks.1"])
    assert train(model, opt, 2) == baseline
    assert calls["pre"] == calls["fwd"] == calls["bwd"] == 2
    assert calls["inner"] == 4  # inner hooks rerun on recomputation, as with torch's checkpoint_wrapper
    handle.revert()
    assert block.__dict__["forward"] is user_forward


def test_no_grad_forward_skips_checkpoint() -> None:
    model, _ = make()
    x, _ = batches(1)[0]
    model.eval()
    expected = model(x)
    apply_activation_checkpointing(model, modules=["blocks.3"])
    with torch.no_grad():
        assert torch.equal(model(x), expected.detach())


def test_ddp_wrapped_model(tmp_path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        base_model, base_opt = make()
        baseline = train(nn.parallel.DistributedDataParallel(base_model), base_opt, 5)
        model, opt = make()
        ddp = nn.parallel.DistributedDataParallel(model)
        keys = list(ddp.state_dict())

        def at_boundary(i: int) -> None:
            if i == 2:  # names are relative to the unwrapped model; the DDP object is passed as held
                apply_activation_checkpointing(ddp, modules=["blocks.1", "blocks.3"])

        assert train(ddp, opt, 5, at_boundary) == baseline
        assert is_checkpointed(model.blocks[1]) and list(ddp.state_dict()) == keys
    finally:
        dist.destroy_process_group()
