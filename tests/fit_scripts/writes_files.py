"""A loop that writes as training scripts do: a folder for its outputs, a log opened for appending,
a checkpoint with ``torch.save`` every step (its name from argv), a cache it writes once and reads
back, and the rotation of old checkpoints (a rename, a removal). Under ``advisor fit`` every value
in them is fake: none of it may reach the user's files."""

import os
import sys
from pathlib import Path

import torch
import torch.nn as nn

out = Path(sys.argv[1])
os.makedirs(out / "logs", exist_ok=True)
cache = out / "cache.txt"
if not cache.exists():
    cache.write_text("prepared\n")
assert cache.read_text() == "prepared\n"  # what it wrote, read back
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    with open(out / "logs" / "train.log", "a") as log:
        log.write(f"step {step}\n")
    torch.save(model.state_dict(), out / "ckpt.pt")
    if (out / "old.pt").exists():
        os.remove(out / "old.pt")  # rotation: the user's own old checkpoint
    os.replace(out / "ckpt.pt", out / "last.pt")
    print(f"step {step} loss {loss.item():.4f}")
