"""Trains a few steps, then forks a child that exits normally (``sys.exit``, so interpreter and
C++ static teardown run in the child), and waits for it.

A reproduction for the zoo's fork check: under ``advisor attach`` the compute probe has run
``torch.profiler`` in this process by then; plain PyTorch's child can hang at exit in kineto's
``ConfigLoader`` destructor after a profiler session. Prints ``child exited N``.
"""

import os
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(4, 8)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}", flush=True)

pid = os.fork()
if pid == 0:
    sys.exit(0)
_, status = os.waitpid(pid, 0)
print(f"child exited {os.waitstatus_to_exitcode(status)}", flush=True)
