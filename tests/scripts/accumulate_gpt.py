"""A nanoGPT-like loop: gradient accumulation with each micro-batch loss divided by K,
AdamW with a decayed and an undecayed parameter group, a cosine learning rate set by hand,
gradient clipping, and a Dropout(p=0) that returns its input unchanged.

Prints ``step N loss X`` with X the step's objective: the sum of its micro-batch losses.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--accumulate", type=int, default=4)
parser.add_argument("--seq", type=int, default=16)
parser.add_argument("--width", type=int, default=32)
args = parser.parse_args()
torch.manual_seed(1337)
VOCAB = 64


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.drop = nn.Dropout(0.0)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y))
        return x + self.mlp(x)


class TinyGPT(nn.Module):
    def __init__(self, width: int, seq: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, width)
        self.wpe = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList([Block(width), Block(width)])
        self.head = nn.Linear(width, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


model = TinyGPT(args.width, args.seq)
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                               {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95))
data = torch.randint(0, VOCAB, (4096,))


def get_batch():
    ix = torch.randint(len(data) - args.seq - 1, (4,))
    x = torch.stack([data[i:i + args.seq] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + args.seq] for i in ix])
    return x, y


def lr_at(it: int) -> float:
    return 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + math.cos(math.pi * it / max(1, args.steps)))


X, Y = get_batch()
for it in range(args.steps):
    for group in optimizer.param_groups:
        group["lr"] = lr_at(it)
    total = 0.0
    for micro in range(args.accumulate):
        _, loss = model(X, Y)
        loss = loss / args.accumulate
        X, Y = get_batch()  # prefetch the next micro-batch while the graph is alive
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {it} loss {total!r}", flush=True)
