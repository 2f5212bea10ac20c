"""Two-rank (gloo) training for the failure tests: one rank fails at a chosen step.

--steps N, --fail-rank R, --fail-at K, --how raise|exit|kill (ValueError with brackets
in its message, os._exit(9), or SIGKILL of itself), --sleep S per step, --pid-dir D
(each rank writes D/rank<R>.pid once it has stepped once).
"""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-at", type=int, default=3)
parser.add_argument("--how", default="raise")
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--pid-dir")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    if rank == args.fail_rank and step == args.fail_at:
        if args.how in ("exit", "kill"):
            time.sleep(0.5)  # the agent's sender has sent what was queued: the test checks the controller
        if args.how == "raise":
            raise ValueError(f"could not open shard [/data/shard-{rank}]")
        if args.how == "exit":
            os._exit(9)
        if args.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    if rank != args.fail_rank and step == args.fail_at and args.how in ("exit", "kill"):
        # Not in a collective when the other rank dies: there, gloo raised "connection closed" and
        # this rank could exit 1 before the launcher saw the other's 9 (a suite run under load).
        time.sleep(5)
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if args.pid_dir and step == 0:
        with open(os.path.join(args.pid_dir, f"rank{rank}.pid"), "w") as handle:
            handle.write(str(os.getpid()))
    if args.sleep:
        time.sleep(args.sleep)
dist.destroy_process_group()
