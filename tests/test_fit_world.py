"""``advisor fit``'s fake world, in this process: what the script sees of a GPU it does not have.

Each test enters ``FitWorld`` for an H100 and leaves it; the last one checks that leaving puts
everything back (this process must train as under python afterwards).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from advisor.fit.reads import FitUnrunnable, Reads
from advisor.fit.world import FitWorld
from advisor.records.fit import TARGETS, FitSettings


class _Stop(BaseException):
    pass


def _world(target: str = "h100", *, steps_done: int = 1, nproc: int = 1) -> FitWorld:
    reads = Reads(steps=3, steps_done=lambda: steps_done, stop=_Stop)
    return FitWorld(FitSettings(target=target, nproc_per_node=nproc), reads)


def test_torch_cuda_answers_for_the_target() -> None:
    h100 = TARGETS["h100"]
    with _world(nproc=8):
        assert torch.cuda.is_available()
        assert torch.cuda.device_count() == 8
        assert torch.cuda.get_device_name() == h100.name
        assert torch.cuda.get_device_properties(0).total_memory == h100.total_memory
        assert torch.cuda.get_device_capability() == (9, 0)
        assert torch.cuda.is_bf16_supported()
        assert torch.cuda.mem_get_info()[1] == h100.total_memory
        torch.cuda.synchronize()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        assert event.query()


def test_a_module_moved_to_the_device_keeps_its_parameters_and_their_ties() -> None:
    with _world() as world:
        class Tied(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = nn.Embedding(16, 8)
                self.head = nn.Linear(8, 16, bias=False)
                self.head.weight = self.emb.weight

        model = Tied()
        weight = model.emb.weight
        assert weight.device.type == "cpu"
        model = model.to("cuda")
        assert model.head.weight is model.emb.weight is weight  # the same object, still tied
        assert weight.device == torch.device("cuda", 0) and weight.is_cuda
        assert isinstance(weight, FakeTensor)
        out = model.head(model.emb(torch.tensor([1, 2, 3], device="cuda")))
        out.sum().backward()
        assert weight.grad is not None and weight.grad.device.type == "cuda"
        host = weight.detach().cpu()
        assert host.device.type == "cpu" and world.mode.place_of(host) is None


def test_cuda_autocast_casts_as_cuda_does() -> None:
    with _world():
        x = torch.randn(4, 8, device="cuda")
        linear = nn.Linear(8, 8).to("cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = linear(x)
            # CUDA's policy, not the CPU's: softmax and layer norm of a bf16 input give float32
            soft, norm = torch.softmax(y, dim=-1), F.layer_norm(y, (8,))
        assert y.dtype == torch.bfloat16 and y.device.type == "cuda"
        assert soft.dtype == torch.float32 and norm.dtype == torch.float32
        assert linear(x).dtype == torch.float32  # outside the region: as written
        assert not torch.is_autocast_enabled("cpu")


def test_weights_are_read_as_shapes(tmp_path: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    # A header declaring 20 GB of bf16 weights, over a file of a few bytes: only the header is read.
    path = tmp_path / "huge.safetensors"
    header = json.dumps({"w": {"dtype": "BF16", "shape": [100000, 100000], "data_offsets": [0, 2 * 10**10]},
                         "__metadata__": {"format": "pt"}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    checkpoint = tmp_path / "small.pt"
    torch.save({"a": torch.ones(3, 4)}, checkpoint)
    with _world() as world:
        loaded = safetensors_torch.load_file(str(path), device="cuda")["w"]
        assert isinstance(loaded, FakeTensor) and loaded.shape == (100000, 100000)
        assert loaded.dtype == torch.bfloat16 and loaded.device.type == "cuda"
        state = torch.load(checkpoint, map_location="cuda")
        assert isinstance(state["a"], FakeTensor) and state["a"].shape == (3, 4) and state["a"].device.type == "cuda"
        host = torch.load(checkpoint)["a"]
        assert world.mode.place_of(host) is None


def test_batches_are_loaded_for_real_and_become_fake_on_the_device() -> None:
    class Numbers(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.full((2,), float(index))

    with _world():
        for workers in (0, 2):
            batch = next(iter(torch.utils.data.DataLoader(Numbers(), batch_size=4, num_workers=workers)))
            assert type(batch) is torch.Tensor and batch.tolist() == [[float(i)] * 2 for i in range(4)]
            moved = batch.to("cuda", non_blocking=True)
            assert isinstance(moved, FakeTensor) and moved.device.type == "cuda"


def test_values_read_get_placeholders_by_line_and_after_the_last_step_stop_the_run() -> None:
    with _world(steps_done=1) as world:
        loss = torch.randn(3, device="cuda").sum()
        # A float reads 1.0 (0.0 ended loops at `if loss < tol: break` and divided by zero), a bool False.
        assert loss.item() == 1.0 and bool(loss > 0) is False
        assert sum(world.reads.log.placeholders.values()) == 2 and not world.reads.log.early
    with _world(steps_done=0) as world:  # before the first step: said apart, by line
        loss = torch.randn(3, device="cuda").sum()
        assert float(loss) == 1.0
        [(path, line, code)] = world.reads.log.early
        assert path == __file__ and "float(loss)" in code
    with _world(steps_done=3):
        with pytest.raises(_Stop):
            torch.randn(3, device="cuda").sum().item()


def test_a_grad_scaler_reads_no_overflow_and_steps() -> None:
    """Float reads get 1.0, but PyTorch's GradScaler asks whether the gradients overflowed: it gets
    0.0 ("no"), so the optimizer steps as it would on the target."""
    with _world(steps_done=1):
        model = nn.Linear(4, 1).to("cuda")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        stepped = []
        optimizer.register_step_post_hook(lambda *args: stepped.append(1))
        scaler = torch.amp.GradScaler("cuda")
        loss = model(torch.randn(2, 4, device="cuda")).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        assert stepped == [1]


def test_the_scripts_host_data_is_real_and_the_models_tensors_fake() -> None:
    """nanoGPT's batches: random offsets drawn on the host, read to slice the data, before the first
    step. Host tensors the script makes are real (reading them works); a module's are fake."""
    with _world(steps_done=0) as world:
        data = torch.arange(100)
        offsets = torch.randint(0, 90, (4,), generator=torch.Generator().manual_seed(0))
        batch = torch.stack([data[i:i + 8] for i in offsets])
        assert type(batch) is torch.Tensor and batch[:, 1].tolist() == (offsets + 1).tolist()
        model = nn.Linear(8, 2)
        assert isinstance(model.weight, FakeTensor) and world.mode.place_of(model.weight) is None
        out = model.to("cuda")(batch.float().to("cuda"))
        assert isinstance(out, FakeTensor) and out.device.type == "cuda"


def test_leaving_puts_torch_back() -> None:
    available = torch.cuda.is_available()
    with _world():
        pass
    assert torch.cuda.is_available() == available
    assert type(torch.ones(2)) is torch.Tensor and torch.ones(2).sum().item() == 2.0
    model = nn.Linear(2, 2)
    assert model.to("cpu").weight.device.type == "cpu"
    assert FakeTensor.__dict__["device"].fget.__module__.startswith("torch")


def test_an_op_whose_shape_depends_on_values_ends_the_run_and_is_named() -> None:
    with _world(steps_done=0):
        with pytest.raises(FitUnrunnable, match="output shape depends on the values") as raised:
            torch.randn(4, device="cuda").nonzero()
        assert raised.value.kind == "shape" and raised.value.op == "aten.nonzero"
    with _world(steps_done=1) as world:
        with pytest.raises(_Stop):
            torch.randn(4, device="cuda").nonzero()
        assert world.reads.log.stopped_by == {"op": "aten.nonzero", "kind": "shape", "step": 1}
        assert world.reads.log.stopped_at is not None and world.reads.log.stopped_at["file"] == __file__


def test_an_op_on_dtensors_is_counted_on_this_ranks_shards() -> None:
    """A world of 4 in this process (PyTorch's fake process group): a DTensor sharded on dim 0,
    whose op the compute probe's counter sees with the global shape, is costed on the local one."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    from advisor.probes.compute.counter import OpCounter

    with _world(nproc=4):
        dist.init_process_group("nccl")
        try:
            mesh = init_device_mesh("cuda", (4,))
            sharded = distribute_tensor(torch.empty(64, 16, device="cuda"), mesh, [Shard(0)])
            counter = OpCounter(lambda: ("", "optimizer"))
            with counter:
                doubled = sharded * 2.0
                sharded.mul_(2.0)
            assert type(doubled) is type(sharded)  # the script still gets its DTensor back
            [call] = [c for c in counter.calls if c.name == "aten.mul_"]
            plain = OpCounter(lambda: ("", "optimizer"))
            with plain:
                torch.empty(16, 16, device="cuda").mul_(2.0)
            [shard] = [c for c in plain.calls if c.name == "aten.mul_"]
            assert call.input_shapes[0] == (16, 16)  # this rank's quarter, not (64, 16)
            assert (call.bytes, call.flops) == (shard.bytes, shard.flops)
        finally:
            dist.destroy_process_group()


def test_the_share_of_a_stopped_step_is_its_ops_over_the_whole_step_before() -> None:
    from advisor.fit.run import ran_share

    assert ran_share({0: 40, 1: 10}, 1) == 0.25
    assert ran_share({0: 40, 1: 50}, 1) == 1.0  # never more than a whole step
    assert ran_share({1: 10}, 1) is None and ran_share({0: 40}, 1) == 0.0
