"""A small residual MLP whose blocks do host work between their kernels: the host-overhead rule's
case on any CPU, loaded or idle (tests/test_apply_attach_e2e.py).

Each block's forward spends ``--host-ms`` in Python before its two tiny matmuls, standing for the
per-call host work (argument checks, Python control flow, dispatch) that compiling a block
removes; the op time then covers a small share of every step however the probes slow the ops.
Prints ``step N loss X`` (X the repr of the float) after each optimizer step.
"""

import argparse
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--host-ms", type=float, default=8.0)
args = parser.parse_args()


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(args.host_ms / 1000.0)  # host work: a graph break under torch.compile, kept exact
        return x + self.proj(torch.tanh(self.fc(x)))


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), Block(16), Block(16), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.02)
gen = torch.Generator().manual_seed(1)
for step in range(args.steps):
    x = torch.randn(4, 8, generator=gen)
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}", flush=True)
