"""Six SGD steps whose loss is NaN (the weights start as NaN), printed as ``step N loss nan``.

A reproduction from the zoo (pytorch/examples' FSDP2 example trains on NaN on CPU): every step
has a loss, but a NaN one.
"""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
with torch.no_grad():
    model.weight.fill_(float("nan"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(8, 4)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item()}", flush=True)
