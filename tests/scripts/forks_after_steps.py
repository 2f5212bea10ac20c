"""Trains a few steps, then forks children that exit normally (``sys.exit(3)``) and waits for each.

After a ``torch.profiler`` session in the parent (the compute probe's timed step), a child that
exits through Python's normal shutdown hung for ever in kineto's config loader destructor.
Prints ``step N loss X`` and ``child exit 3``.
"""

import os
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(4, 8)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}", flush=True)
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        torch.randn(3).sum()
        sys.exit(3)
    _, status = os.waitpid(pid, 0)
    print(f"child exit {os.waitstatus_to_exitcode(status)}", flush=True)
