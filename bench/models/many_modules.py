"""A training script with many small modules, for the module-count sweep (bench/module_count.py).

    python bench/models/many_modules.py --modules 5001 --steps 12

The model is an ``nn.Sequential`` of (Linear(16, 16), Tanh) pairs, ``--modules`` modules in all
with the root; Adam, fp32, one fixed synthetic batch. Prints ``step N loss X s T`` after each step
(T: the step's own seconds, forward to the loss read) and, at the end, ``peak rss N KiB`` (this process's ``ru_maxrss``) and ``train s X`` (the loop's
own wall time, first step to last).
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modules", type=int, default=5001, help="modules in all, the root included (odd)")
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(max(1, (args.modules - 1) // 2)):
        layers += [nn.Linear(16, 16), nn.Tanh()]
    model = nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()
        print(f"step {step} loss {value:.6f} s {time.perf_counter() - t0:.6f}", flush=True)
    print(f"train s {time.perf_counter() - start:.3f}", flush=True)
    print(f"peak rss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} KiB", flush=True)


if __name__ == "__main__":
    main()
