"""A plain MLP training script for the prediction bench: a chain of residual MLP blocks.

    python bench/models/chain.py --widths 256,256,256,256          # an MLP of equal blocks
    python bench/models/chain.py --widths 128,512,1024,256 --batch 64  # blocks that differ in size

Each block is ``x + W2 gelu(W1 layernorm(x))`` with an inner width from ``--widths`` (so the
blocks' activations differ when the widths do), held in ``self.blocks`` (an ``nn.Sequential``),
AdamW, fp32, synthetic regression batches from a private generator; prints ``step N loss X``.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, inner)
        self.act = nn.GELU()
        self.down = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


class Chain(nn.Module):
    def __init__(self, dim: int, widths: list[int]) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim, w) for w in widths))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--widths", default="256,256,256,256")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=32, help="rows per sample (a sequence-like second dimension)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    model = Chain(args.dim, [int(w) for w in args.widths.split(",")])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(args.seed + 1)
    for step in range(args.steps):
        x = torch.randn(args.batch, args.tokens, args.dim, generator=gen)
        y = x.mean(dim=-1, keepdim=True)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
