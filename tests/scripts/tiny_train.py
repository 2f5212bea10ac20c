"""A tiny training loop for the advisor's own tests.

--steps N, --raise-at K (raise ValueError at step K), --exit-code C (sys.exit(C)
after the loop), --sleep S (seconds per step), --pid-file F (write os.getpid()),
--done-file F (written when the loop finishes), --accumulate K (micro-batches).
"""

import argparse
import os
import sys
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--raise-at", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=None)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--pid-file")
parser.add_argument("--done-file")
parser.add_argument("--accumulate", type=int, default=1)
args = parser.parse_args()

if args.pid_file:
    with open(args.pid_file, "w") as handle:
        handle.write(str(os.getpid()))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
print("argv", sys.argv[1:], flush=True)


def train_step(step: int) -> float:
    if step == args.raise_at:
        raise ValueError(f"boom at step {step}")
    total = 0.0
    for _ in range(args.accumulate):
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        loss.backward()
        total += loss.item()
    opt.step()
    opt.zero_grad()
    return total / args.accumulate


for step in range(args.steps):
    loss = train_step(step)
    print(f"step {step} loss {loss!r}", flush=True)
    if args.sleep:
        time.sleep(args.sleep)

if args.done_file:
    with open(args.done_file, "w") as handle:
        handle.write("done")
if args.exit_code is not None:
    sys.exit(args.exit_code)
