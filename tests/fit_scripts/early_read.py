"""A training loop that reads a value the model computed before its first optimizer step: a loss
check that skips non-finite batches. ``advisor fit`` cannot run it on fake tensors, and says where."""

import torch
import torch.nn as nn

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(4, 8)).square().mean()
    if not torch.isfinite(loss):  # the read: a Python bool of a tensor's value
        continue
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item()!r}", flush=True)
