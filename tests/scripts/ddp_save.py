"""A DDP job on gloo that writes its own checkpoints: rank 0 saves every --save-every steps.

    --save torch       torch.save({"model": ..., "optimizer": ...}) on rank 0
    --save torch-model torch.save(model.state_dict()) on rank 0
    --save dcp         torch.distributed.checkpoint.save of both, from every rank
    --save none        no checkpoint (the control)

Prints ``step N loss X`` on rank 0. Used by tests/test_zero_checkpoint.py (issue 11: ZeRO is
refused where it would make this script's checkpoints partial).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", choices=["none", "torch", "torch-model", "dcp"], default="torch")
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1 + rank)
    out = args.out or tempfile.mkdtemp(prefix="ddp_save_")
    for step in range(args.steps):
        x = torch.randn(32, 64, generator=gen)
        y = torch.randint(0, 8, (32,), generator=gen)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item()!r}", flush=True)
        if (step + 1) % args.save_every:
            continue
        if args.save == "torch" and rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                       os.path.join(out, "ckpt.pt"))
        elif args.save == "torch-model" and rank == 0:
            torch.save(model.state_dict(), os.path.join(out, "model.pt"))
        elif args.save == "dcp":
            import torch.distributed.checkpoint as dcp

            dcp.save({"model": model.state_dict(), "optimizer": opt.state_dict()},
                     checkpoint_id=os.path.join(out, f"dcp{step}"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
