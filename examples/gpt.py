"""A small GPT-style decoder trained on synthetic tokens.

A plain training script, the kind a user would write: argparse, a model, an
optimizer, a loop. It prints one line per optimizer step,
``step N loss X`` with X the repr of the Python float, so two runs can be
compared exactly.

    python examples/gpt.py                      # fast on a laptop CPU
    python examples/gpt.py --layers 24 --hidden 2048 --heads 16 --seq 2048 \\
        --batch 8 --vocab 50304 --device cuda --dtype bfloat16

Parameter count (no weight tying, every Linear and LayerNorm has a bias), with
V vocabulary, s sequence length (learned positions), h hidden size, l layers:

    embeddings   V*h + s*h
    per layer    12*h^2 + 13*h   (qkv 3h^2+3h, out h^2+h, mlp 8h^2+5h, 2 norms 4h)
    final norm   2*h
    lm_head      h*V + V

    total = V*h + s*h + l*(12*h^2 + 13*h) + 2*h + h*V + V

Activation memory is dominated by the blocks (attention and the 4h-wide MLP),
so checkpointing each block is a meaningful remedy.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab: int = 512
    seq: int = 64
    layers: int = 4
    hidden: int = 128
    heads: int = 4

    def param_count(self) -> int:
        """The formula in the module docstring."""
        V, s, h, l = self.vocab, self.seq, self.hidden, self.layers
        return V * h + s * h + l * (12 * h * h + 13 * h) + 2 * h + h * V + V


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.hidden % cfg.heads:
            raise ValueError(f"--hidden {cfg.hidden} is not divisible by --heads {cfg.heads}")
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        # (b, s, h) -> (b, heads, s, h/heads)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.hidden, 4 * cfg.hidden)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos_emb = nn.Embedding(cfg.seq, cfg.hidden)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def synthetic_batch(gen: torch.Generator, cfg: GPTConfig, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token targets on a learnable sequence: each row counts up from a random start
    with a random stride, modulo the vocabulary, so the loss can fall."""
    start = torch.randint(0, cfg.vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, 8, (batch, 1), generator=gen)
    seq = (start + stride * torch.arange(cfg.seq + 1)) % cfg.vocab
    return seq[:, :-1], seq[:, 1:]


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    raise ValueError(f"unknown optimizer {name!r}; choose adamw, adam or sgd")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--optimizer", choices=["adamw", "adam", "sgd"], default="adamw")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16 means autocast on CUDA; parameters stay fp32")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = pick_device(args.device)

    cfg = GPTConfig(vocab=args.vocab, seq=args.seq, layers=args.layers,
                    hidden=args.hidden, heads=args.heads)
    model = GPT(cfg).to(device)
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr)
    gen = torch.Generator().manual_seed(args.seed)

    autocast = (torch.autocast(device.type, dtype=torch.bfloat16)
                if args.dtype == "bfloat16" else contextlib.nullcontext())

    model.train()
    for step in range(args.steps):
        x, y = synthetic_batch(gen, cfg, args.batch)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast:
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, cfg.vocab).float(), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
