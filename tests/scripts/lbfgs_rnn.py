"""Sequence prediction with an LSTMCell unrolled in Python and trained with LBFGS: the
forward and backward run inside ``optimizer.step(closure)``, several times per step.

Prints ``step N loss X`` with X the value ``optimizer.step`` returns (the first evaluation).
"""

import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--length", type=int, default=12)
args = parser.parse_args()
torch.manual_seed(0)


class Sequence(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 16)
        self.lstm2 = nn.LSTMCell(16, 16)
        self.linear = nn.Linear(16, 1)

    def forward(self, x):
        h1 = c1 = torch.zeros(x.size(0), 16)
        h2 = c2 = torch.zeros(x.size(0), 16)
        outputs = []
        for t in range(x.size(1)):
            h1, c1 = self.lstm1(x[:, t:t + 1], (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            outputs.append(self.linear(h2))
        return torch.cat(outputs, dim=1)


t = torch.arange(args.length + 1, dtype=torch.float32)
waves = torch.sin(t / 3.0 + torch.rand(8, 1) * 6.0)
inputs, targets = waves[:, :-1], waves[:, 1:]
seq = Sequence()
criterion = nn.MSELoss()
optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.5, max_iter=4)
for step in range(args.steps):
    def closure():
        optimizer.zero_grad()
        loss = criterion(seq(inputs), targets)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    print(f"step {step} loss {loss.item()!r}", flush=True)
