"""A loop that picks entries by value after each step (``nonzero``): the output's shape depends on
values that fake tensors do not have, so ``advisor fit`` stops there cleanly with the steps before
it measured."""

import torch
import torch.nn as nn

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    positive = (model.weight > 0).nonzero()  # a shape a fit cannot know
