"""What a step's global module hooks cost per module, in one process, side by side.

    python bench/module_hooks.py                   # 1000 blocks (6001 modules), 5 rounds
    python bench/module_hooks.py --blocks 200 --rounds 9

One forward of an ``nn.Sequential`` of ``--blocks`` blocks (a Linear(8, 8) and four Identity),
one thread, timed four ways, alternated each round: bare; with two no-op global hooks (a
forward pre-hook, and a forward hook with ``always_call=True`` as the agent registers it), the
cost of PyTorch's slow ``_call_impl`` path that any global hook turns on; with the agent's own
hooks on a light step (``advisor.agent.hooks.install`` on an agent with no probes: the pair is
lifted inside the top-level forward, ``advisor/agent/forward_hooks.py``); and the same with one
no-op subscriber to the agent's module events, as on a deep or block-timed step, where every
module's call is seen. Each figure is the best of 15 forwards; printed: the median over rounds of
each, and per module each one's cost over bare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from advisor.agent.agent import Agent  # noqa: E402
from advisor.agent.hooks import install  # noqa: E402
from advisor.records.settings import AgentSettings  # noqa: E402

FORWARDS = 15


def best_forward(model: nn.Module, x: torch.Tensor) -> float:
    best = float("inf")
    for _ in range(FORWARDS):
        start = time.perf_counter()
        model(x)
        best = min(best, time.perf_counter() - start)
    return best


def noop_hooks() -> list:
    return [nn.modules.module.register_module_forward_pre_hook(lambda module, args: None),
            nn.modules.module.register_module_forward_hook(lambda module, args, out: None, always_call=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), *[nn.Identity() for _ in range(4)])
                            for _ in range(args.blocks)])
    modules = sum(1 for _ in model.modules())
    x = torch.randn(2, 8)
    agent = Agent(emit=lambda record: None, settings=AgentSettings(probes=()), probes=[])
    times: dict[str, list[float]] = {"bare": [], "no-op global hooks": [], "advisor, light step": [],
                                     "advisor, deep step": []}
    for _ in range(args.rounds):
        times["bare"].append(best_forward(model, x))
        handles = noop_hooks()
        times["no-op global hooks"].append(best_forward(model, x))
        for handle in handles:
            handle.remove()
        hooks = install(agent)
        times["advisor, light step"].append(best_forward(model, x))
        unsubscribe = agent.module_events.subscribe(lambda module, args: None, lambda module, args, out: None)
        times["advisor, deep step"].append(best_forward(model, x))
        unsubscribe()
        hooks.remove()
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{modules} modules, one forward, best of {FORWARDS}, median of {args.rounds} rounds (one thread)")
    per = 1e6 / modules
    for name, value in medians.items():
        over = "" if name == "bare" else f"   {(value - medians['bare']) * per:+.2f} us a module over bare"
        print(f"  {name:<20} {value * 1e3:8.2f} ms{over}")


if __name__ == "__main__":
    main()
