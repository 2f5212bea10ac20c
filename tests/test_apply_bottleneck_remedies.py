"""The live appliers of the bottleneck remedies on CPU: each changes what it says, keeps the job
running, and ``revert()`` restores it exactly."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from advisor.apply.remedies.autocast_bf16 import apply_autocast_bf16
from advisor.apply.remedies.dataloader import apply_dataloader
from advisor.apply.remedies.expandable_segments import apply_expandable_segments
from advisor.apply.remedies.tf32_matmul import apply_tf32_matmul
from advisor.apply.target import Target
from advisor.recommend.remedies import check_params


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_tf32_sets_the_matmul_precision_and_revert_restores_it() -> None:
    matmul = torch.backends.cuda.matmul
    attribute = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    before = getattr(matmul, attribute)
    handle = apply_tf32_matmul(Target())
    assert getattr(matmul, attribute) in ("tf32", True)
    with pytest.raises(ValueError, match="already"):
        apply_tf32_matmul(Target())
    handle.revert()
    handle.revert()  # twice: nothing the second time
    assert getattr(matmul, attribute) == before


def test_autocast_runs_the_forward_in_bf16_and_revert_restores_fp32() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    eager = model(x)
    handle = apply_autocast_bf16(Target.of(model))
    out = model(x)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), eager, atol=5e-2)  # bf16 has an 8-bit mantissa
    out.float().sum().backward()  # gradients flow, into fp32 parameters
    assert model[0].weight.grad is not None and model[0].weight.grad.dtype == torch.float32
    with pytest.raises(ValueError, match="already"):
        apply_autocast_bf16(Target.of(model))
    handle.revert()
    assert "forward" not in model.__dict__
    assert torch.equal(model(x), eager)


class Indexed(Dataset):
    """Sample i is i (and a little sleep, standing in for decoding)."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.tensor([float(index)])


def epochs(apply_at: int | None, revert_at: int | None, **params) -> tuple[list[list[float]], list[list[float]], list[int]]:
    loader = DataLoader(Indexed(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))
    it = iter(loader)
    first, workers, handle = [], [], None
    for step, batch in enumerate(it):
        if step == apply_at:
            handle = apply_dataloader(Target(dataloaders=[loader], dataloader_iterators=[it]), **params)
        if step == revert_at:
            handle.revert()
        workers.append(loader.num_workers)
        first.append(batch.flatten().tolist())
    second = [b.flatten().tolist() for b in loader]  # the next epoch, as the script would run it
    return first, second, workers


def test_dataloader_workers_switch_mid_epoch_keeps_the_batch_order_and_reverts() -> None:
    bare_first, bare_second, _ = epochs(None, None)
    first, second, workers = epochs(3, 8, num_workers=2)
    assert first == bare_first and second == bare_second  # same batches, same order, both epochs
    assert workers[:3] == [0, 0, 0] and workers[3:8] == [2] * 5 and workers[8:] == [0] * 4


def test_dataloader_applied_between_epochs_takes_effect_at_the_next_iter() -> None:
    loader = DataLoader(Indexed(), batch_size=4, shuffle=False)
    it = iter(loader)
    bare = [b.flatten().tolist() for b in it]  # exhausted
    told = []
    handle = apply_dataloader(Target(dataloaders=[loader], dataloader_iterators=[it],
                                     notify=lambda name, data: told.append((name, data["num_workers"]))),
                              num_workers=2)
    assert (loader.num_workers, loader.prefetch_factor) == (2, 2)
    assert [b.flatten().tolist() for b in loader] == bare
    handle.revert()
    assert (loader.num_workers, loader.prefetch_factor) == (0, None)
    assert told == [("dataloader", 2), ("dataloader", 0)]  # the controller sees the settings in force


def test_dataloader_refusals_change_nothing() -> None:
    loader = DataLoader(Indexed(), batch_size=4)
    target = Target(dataloaders=[loader], dataloader_iterators=[None])
    with pytest.raises(ValueError, match="already"):
        apply_dataloader(target, num_workers=0)
    with pytest.raises(ValueError, match="loader must be"):
        apply_dataloader(target, loader=1, num_workers=2)
    if not torch.accelerator.is_available():
        with pytest.raises(ValueError, match="accelerator"):
            apply_dataloader(target, pin_memory=True)
    assert (loader.num_workers, loader.pin_memory) == (0, False)


def test_expandable_segments_checks_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    with pytest.raises(ValueError, match="expandable_segments:True"):
        apply_expandable_segments(Target())
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64,expandable_segments:True")
    apply_expandable_segments(Target()).revert()


@pytest.mark.parametrize("name, params, message", [
    ("dataloader", {"num_workers": -1}, "num_workers"),
    ("dataloader", {"prefetch_factor": 0}, "prefetch_factor"),
    ("compile_blocks", {"modules": []}, "non-empty"),
    ("grad_compression", {"dtype": "int8"}, "dtype"),
    ("ddp_bucket", {"bucket_cap_mb": 0}, "positive"),
    ("grad_accumulation", {"micro_batches": 1}, ">= 2"),
    ("autocast_bf16", {"model": -1}, "index"),
])
def test_params_are_checked_without_torch(name, params, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_params(name, params)


@pytest.mark.gpu
def test_on_cuda_tf32_and_autocast_change_the_matmul_and_revert() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(256, 256, device="cuda"), torch.randn(256, 256, device="cuda")
    exact = a @ b
    handle = apply_tf32_matmul(Target(device=torch.device("cuda")))
    assert not torch.equal(a @ b, exact)  # inputs rounded to TF32 on tensor cores
    handle.revert()
    assert torch.equal(a @ b, exact)
    model = torch.nn.Linear(256, 256).cuda()
    handle = apply_autocast_bf16(Target(wrapped_models=[model], device=torch.device("cuda")))
    assert model(a).dtype == torch.bfloat16
    handle.revert()
    assert model(a).dtype == torch.float32
