"""A loop with two deep copies real scripts make: an EMA of the model (``copy.deepcopy(model)``)
and a metric's running state copied from a default (torchmetrics' ``add_state``, which Lightning's
``self.log`` calls). Under ``advisor fit`` the second stopped the script: the copy of a real host
tensor made under the fake mode got a fake storage a real tensor cannot take."""

import copy

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
ema = copy.deepcopy(model).requires_grad_(False)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
default = torch.tensor(0.0)
for step in range(5):
    running = copy.deepcopy(default)  # a fresh metric state, as add_state makes each time
    x = torch.randn(32, 64)
    loss = (model(x) - x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.lerp_(p, 0.01)
        running += 1
    print(f"step {step} state {float(running)}")
