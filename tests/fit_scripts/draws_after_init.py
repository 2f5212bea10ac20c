"""A script whose batch shape comes from a random draw made after the model's initialisation (as a
DataLoader's shuffle picks a dynamically padded batch): under ``advisor fit`` the initialisation is
fake, and unless its draws are replayed on the real generator the batch, and the peak, differ."""

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
nn.init.normal_(model[2].weight, std=0.02)
lengths = torch.randint(16, 1024, (8,))  # drawn after the model's init
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.randn(int(lengths[step]), 64)
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} rows {int(lengths[step])}")
