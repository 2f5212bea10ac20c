"""A loop inside ``with advisor.session(...)`` (tests/test_api_session.py), or bare (``--bare``).

The model and the optimizer(s) are built before the block, as in a notebook. Prints each step's
loss (a float's repr), then trains two more steps after the block, then whether every global hook
the agent installed is gone. ``--gan``: two models and two optimizers stepped in turn.
``--gpt``: examples/gpt.py's model, small. ``--apply-id PREFIX --apply-at K``: at step K, apply
the first live recommendation whose id starts with PREFIX through ``s.apply`` (the live
recommendations' ids are written to the result).
"""

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import advisor

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--bare", action="store_true")
parser.add_argument("--gan", action="store_true")
parser.add_argument("--gpt", action="store_true")
parser.add_argument("--gpt-layers", type=int, default=2)
parser.add_argument("--gpt-hidden", type=int, default=32)
parser.add_argument("--probes", default="all")
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--budget")
parser.add_argument("--apply-id")
parser.add_argument("--apply-at", type=int, default=-1)
parser.add_argument("--result")
args = parser.parse_args()

torch.manual_seed(0)


def hooks_and_wrappers() -> tuple:
    """The global hook tables' sizes and the functions the agent wraps, as they are now."""
    return (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks),
            len(optim_module._global_optimizer_pre_hooks), len(optim_module._global_optimizer_post_hooks),
            torch.autograd.backward, torch.optim.Optimizer.__init__, torch.optim.Optimizer.zero_grad,
            torch.nn.Module.zero_grad, torch.optim.lr_scheduler.LRScheduler.__init__,
            torch.utils.data.DataLoader.__init__, torch.utils.data.DataLoader.__iter__,
            torch.utils.data.dataloader._BaseDataLoaderIter.__next__, torch.amp.grad_scaler.GradScaler.scale,
            torch.nn.parallel.DistributedDataParallel.__init__, torch.save, sys.unraisablehook, tuple(sys.meta_path))


before = hooks_and_wrappers()


if args.gpt:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from gpt import GPT, GPTConfig, synthetic_batch

    cfg = GPTConfig(vocab=64, seq=16, layers=args.gpt_layers, hidden=args.gpt_hidden, heads=2)
    model = GPT(cfg)
    gen = torch.Generator().manual_seed(0)
else:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
if args.gan:
    critic = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt_critic = torch.optim.Adam(critic.parameters(), lr=1e-3)

session = None if args.bare else advisor.session(name="inprocess", memory_budget=args.budget, probes=args.probes)
applied = None
with session if session is not None else contextlib.nullcontext():
    for step in range(args.steps):
        x = torch.randn(args.batch, 16)
        if args.gan:
            critic_loss = critic(model(x).detach()).mean()
            critic_loss.backward()
            opt_critic.step()
            opt_critic.zero_grad()
        if args.gpt:
            x, y = synthetic_batch(gen, cfg, args.batch)
            loss = torch.nn.functional.cross_entropy(model(x).view(-1, cfg.vocab), y.reshape(-1))
        else:
            loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step} loss {loss.item()!r}", flush=True)
        if step == args.apply_at and session is not None:
            offered = [r["id"] for r in session.recommendations() if r.get("live")]
            chosen = next((i for i in offered if i.startswith(args.apply_id)), None)
            applied = {"offered": offered, "sent": session.apply(chosen) if chosen else None}

for step in range(2 if not args.gpt else 0):  # training goes on after the block
    loss = model(torch.randn(32, 16)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"after {step} loss {loss.item()!r}", flush=True)

print("hooks removed", hooks_and_wrappers() == before, flush=True)
if args.result and session is not None:
    with open(args.result, "w") as handle:
        json.dump({"id": session.id, "steps": session.report()["steps"], "applied": applied,
                   "exit_code": session.exit_code}, handle)
sys.exit(0)
