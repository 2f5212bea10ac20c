"""A loop that hands a tensor's data to numpy after each step (as dcgan's save_image does): fake
tensors have no data, so ``advisor fit`` stops there cleanly with the steps before it measured."""

import torch
import torch.nn as nn

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    snapshot = model.weight.detach().numpy()  # the data access a fit cannot answer
