"""A small MLP fed by a DataLoader whose samples are slow to load.

    python examples/slow_input.py                  # input-bound: loading dominates each step
    python examples/slow_input.py --workers 2      # the usual remedy
    python examples/slow_input.py --workers 4 --pin-memory --device cuda

A plain training script: each ``__getitem__`` sleeps ``--load-ms`` milliseconds
(standing in for decoding or reading from disk), so with the default
``--workers 0`` a step spends about batch x load-ms (16 x 3 ms = 48 ms) waiting
for data and only a few milliseconds computing. It prints one line per
optimizer step, ``step N loss X`` with X the repr of the Python float.

Every sample is a function of its index and the seed alone, and the shuffle
uses a seeded generator, so the losses do not depend on the number of workers.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

NUM_CLASSES = 10


class SlowDataset(Dataset):
    def __init__(self, size: int, features: int, load_ms: float, seed: int) -> None:
        self.size = size
        self.features = features
        self.load_ms = load_ms
        self.seed = seed
        self.teacher = torch.randn(features, NUM_CLASSES,
                                   generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.load_ms / 1000.0)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(self.features, generator=gen)
        return x, (x @ self.teacher).argmax()


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--load-ms", type=float, default=3.0, help="sleep per sample in __getitem__")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = pick_device(args.device)

    dataset = SlowDataset(args.steps * args.batch, args.features, args.load_ms, args.seed)
    loader = DataLoader(
        dataset,
        batch_size=args.batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
        num_workers=args.workers,
        # Pinning needs an accelerator; on a CPU-only machine it would only warn.
        pin_memory=args.pin_memory and device.type == "cuda",
        drop_last=True,
    )

    model = nn.Sequential(
        nn.Linear(args.features, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, NUM_CLASSES),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    model.train()
    for step, (x, y) in enumerate(loader):
        if step >= args.steps:
            break
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
