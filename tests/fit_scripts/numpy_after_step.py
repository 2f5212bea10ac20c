"""A loop that hands a tensor's data to numpy after each step (as dcgan's save_image does) and
writes it to a file: ``advisor fit`` answers with zeros of its shape, counted as a read, and the
file goes to the session's ``writes/``."""

import sys

import numpy as np
import torch
import torch.nn as nn

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    snapshot = model.weight.detach().numpy()  # the data access a fit answers with zeros
    assert snapshot.shape == (1, 8) and snapshot.dtype == np.float32
    np.save(sys.argv[1], snapshot)
