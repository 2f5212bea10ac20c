"""A data-parallel MLP for ``advisor fit``'s multi-rank checks: DDP, ZeRO-1, ZeRO-2 or ZeRO-3.

Every layer is a ``Linear(width, width, bias=False)``, so each of ``layers`` parameters has the
same size and a world that divides ``layers`` shards them evenly: the per-rank bytes of each
ZeRO stage are then the textbook figures, with nothing left over. Launched by torchrun (or
``advisor fit --nproc-per-node N``): RANK, WORLD_SIZE and LOCAL_RANK come from the environment.

    --mode ddp     DistributedDataParallel, the optimizer replicated
    --mode zero1   DDP and ZeroRedundancyOptimizer (optimizer state partitioned)
    --mode zero2   FSDP2 fully_shard per layer, reshard_after_forward=False
    --mode zero3   FSDP2 fully_shard per layer, reshard_after_forward=True
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "zero1", "zero2", "zero3"], default="ddp")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = p.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    torch.manual_seed(0)
    layers = [nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)]
    model: nn.Module = nn.Sequential(*layers).to(device)
    if args.mode in ("ddp", "zero1"):
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if args.device == "cuda" else None)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in layers:
            fully_shard(layer, reshard_after_forward=args.mode == "zero3")
        fully_shard(model, reshard_after_forward=args.mode == "zero3")
    if args.mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer: torch.optim.Optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                                                   lr=1e-3)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        x = torch.randn(args.batch, args.width, device=device)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item()!r}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
