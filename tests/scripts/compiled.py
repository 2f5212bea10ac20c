"""A model trained through ``torch.compile`` (the eager backend by default: dynamo's tracing
and guards without a C++ compiler), with a Dropout(p=0) and an in-place activation inside.

Prints ``step N loss X``.
"""

import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--backend", default="eager")
args = parser.parse_args()
torch.manual_seed(3)

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(inplace=True), nn.Dropout(0.0), nn.Linear(32, 32),
                      nn.Tanh(), nn.Linear(32, 1))
compiled = torch.compile(model, backend=args.backend)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(args.steps):
    x = torch.randn(8, 16)
    loss = (compiled(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}", flush=True)
