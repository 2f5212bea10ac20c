"""Modules named with Rich markup, brackets, backslashes and a terminal escape, for the tests that
every user-derived string is printed as text (tests/test_names_render.py).

``--steps N`` optimizer steps (default 6); ``--fail`` raises an exception whose message holds
markup and an escape sequence after the last step.
"""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--fail", action="store_true")
args = parser.parse_args()

NAMES = ("[/]", "[bold]x", "a\\b", "red\x1b[31mtext")


class Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({name: nn.Linear(16, 16) for name in NAMES})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = torch.relu(block(x))
        return x


torch.manual_seed(0)
model = Odd()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("done", flush=True)
if args.fail:
    raise ValueError("bad shard [/data/x] [bold]y[/] \x1b[2Jcleared")
