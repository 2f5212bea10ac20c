"""Data-parallel training of a small residual MLP, launched by torchrun.

    python -m torch.distributed.run --nproc-per-node 2 examples/ddp.py
    python -m torch.distributed.run --nproc-per-node 8 examples/ddp.py \\
        --hidden 4096 --layers 16 --batch 64 --device cuda --dtype bfloat16

A plain script: it reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT from the environment (torchrun sets them; so may any other parent),
uses gloo on CPU and nccl on CUDA (device cuda:LOCAL_RANK), wraps the model in
DistributedDataParallel and prints one line per optimizer step on rank 0 only,
``step N loss X`` with X the repr of rank 0's loss as a Python float. Run without
those variables it trains as a single rank.

Each rank draws its own batches from a generator seeded with seed + rank; the
labels come from a fixed teacher (seeded with seed alone) so the loss can fall.

Flags that shape the communication, for the advisor's probes:
  --accumulate K          K micro-batches per step, the first K-1 under model.no_sync()
  --explicit-allreduce N  after each optimizer step, all_reduce a float32 tensor of N elements
  --slow-rank R --slow-ms MS   rank R sleeps MS ms just before each backward
  --zero                  torch.distributed.optim.ZeroRedundancyOptimizer around AdamW
  --fsdp                  FSDP2 fully_shard on each layer and the root instead of DDP
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

NUM_CLASSES = 10


class ResidualLayer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(self.act(self.fc(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.layers = nn.ModuleList([ResidualLayer(hidden) for _ in range(layers)])
        self.head = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(device_arg: str) -> tuple[int, int, torch.device]:
    """Initialise the default process group from the launcher's environment."""
    if "RANK" not in os.environ:  # run plainly: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_arg == "cuda" or (device_arg == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo")
    return dist.get_rank(), dist.get_world_size(), device


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="per rank, per micro-batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16 means autocast on CUDA; parameters stay fp32")
    p.add_argument("--accumulate", type=int, default=1, metavar="K")
    p.add_argument("--explicit-allreduce", type=int, default=0, metavar="N")
    p.add_argument("--slow-rank", type=int, default=-1, metavar="R")
    p.add_argument("--slow-ms", type=float, default=0.0, metavar="MS")
    p.add_argument("--zero", action="store_true")
    p.add_argument("--fsdp", action="store_true")
    args = p.parse_args(argv)
    if args.accumulate < 1:
        p.error("--accumulate must be at least 1")
    if args.zero and args.fsdp:
        p.error("--zero and --fsdp are alternatives: FSDP already shards the optimizer state")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = init_distributed(args.device)
    torch.manual_seed(args.seed)  # same initial weights on every rank

    model = MLP(args.features, args.hidden, args.layers).to(device)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    else:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    if args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer: torch.optim.Optimizer = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.AdamW, lr=args.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    teacher = torch.randn(args.features, NUM_CLASSES,
                          generator=torch.Generator().manual_seed(args.seed))
    gen = torch.Generator().manual_seed(args.seed + rank)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16)
                if args.dtype == "bfloat16" else contextlib.nullcontext())

    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for micro in range(args.accumulate):
            x = torch.randn(args.batch, args.features, generator=gen)
            y = (x @ teacher).argmax(dim=1)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            last = micro == args.accumulate - 1
            if args.fsdp:
                model.set_requires_gradient_sync(last)
                sync = contextlib.nullcontext()
            else:
                sync = contextlib.nullcontext() if last else model.no_sync()
            with sync:
                with autocast:
                    loss = F.cross_entropy(model(x).float(), y) / args.accumulate
                if rank == args.slow_rank and args.slow_ms > 0:
                    time.sleep(args.slow_ms / 1000.0)
                loss.backward()
            total += loss.detach()
        optimizer.step()
        if args.explicit_allreduce > 0:
            extra = torch.ones(args.explicit_allreduce, dtype=torch.float32, device=device)
            dist.all_reduce(extra)
        if rank == 0:
            print(f"step {step} loss {total.item()!r}", flush=True)

    # Every rank finishes its collectives (ZeroRedundancyOptimizer's broadcasts are asynchronous)
    # before the group goes: torch 2.13's gloo aborts the process ("terminate called without an
    # active exception") when a group is destroyed under a rank's outstanding work.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
