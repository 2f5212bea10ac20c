"""A small training loop that profiles itself with torch.profiler, for the importer's tests.

``python profiled_train.py --out DIR [--steps N] [--width W]`` writes DIR/rank{R}.json (a Kineto
trace with ProfilerStep#0..N-1, shapes recorded). Under torchrun (WORLD_SIZE > 1) every rank
joins a gloo process group and trains a DDP model. ``train(out, steps, width)`` is the same,
called in-process.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile, schedule


def train(out: str, steps: int = 6, width: int = 64, batch: int = 32) -> None:
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if distributed else 0
    generator = torch.Generator().manual_seed(0)
    model: torch.nn.Module = torch.nn.Sequential(
        torch.nn.Linear(width, 2 * width), torch.nn.ReLU(), torch.nn.Linear(2 * width, 10))
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(steps * batch, width, generator=generator),
                                          torch.randint(0, 10, (steps * batch,), generator=generator))
    loader = torch.utils.data.DataLoader(data, batch_size=batch)

    def ready(prof: profile) -> None:
        prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=0, active=steps, repeat=1), on_trace_ready=ready) as prof:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    train(args.out, args.steps, args.width, args.batch)
