"""A DataLoader loop (num_workers=0), Adam, 32 steps; prints ``step N loss X``.

A reproduction from the zoo (the accelerate and Lightning examples): with ``--apply auto`` and a
small budget the advisor chooses ``dataloader-workers`` (apply class live-opt-in, no predicted
peak), refuses it for want of ``--allow-inexact``, and exits 1 where the script exits 0.
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 32), torch.randn(512, 1))
loader = DataLoader(data, batch_size=16, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}", flush=True)
