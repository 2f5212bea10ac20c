"""A loop that logs its loss with a format spec after each step, as llmc's trainer does
(``f"{lossf:.6f}"``): ``advisor fit`` answers the read with a placeholder and goes on."""

import torch
import torch.nn as nn

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.detach():.4f}")
