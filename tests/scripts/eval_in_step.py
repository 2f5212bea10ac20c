"""An MNIST-like loop on a DataLoader, Adadelta and StepLR, with an evaluation pass over a
validation DataLoader under no_grad right after every second optimizer step, and a final
test pass after the loop.

Prints ``step N loss X``, ``val loss X`` after each evaluation and ``test loss X`` at the end.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--eval-every", type=int, default=2)
args = parser.parse_args()
torch.manual_seed(1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)


def dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.randn(n, 1, 14, 14), torch.randint(0, 10, (n,)))


train_loader = DataLoader(dataset(8 * args.steps), batch_size=8, shuffle=True)
val_loader = DataLoader(dataset(32), batch_size=16)
model = Net()
optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)


def evaluate(loader) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += F.nll_loss(model(x), y, reduction="sum").item()
    model.train()
    return total / len(loader.dataset)


for step, (x, y) in enumerate(train_loader):
    optimizer.zero_grad()
    loss = F.nll_loss(model(x), y)
    loss.backward()
    optimizer.step()
    scheduler.step()
    print(f"step {step} loss {loss.item()!r}", flush=True)
    if (step + 1) % args.eval_every == 0:
        print(f"val loss {evaluate(val_loader)!r}", flush=True)
print(f"test loss {evaluate(val_loader)!r}", flush=True)
