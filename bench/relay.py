"""Cost of the multi-node command relay per step boundary, beside the step it rides on.

    python bench/relay.py [--steps N] [--hidden H]

Two gloo ranks on this host train examples/ddp.py's MLP with DDP; each step is timed, then the
relay's exchange (advisor/agent/relay.py: one 8-byte broadcast over its gloo group when
nothing is to be relayed) is timed at the same boundary. Prints, per rank, the median step, the
median exchange, and their ratio. Over real nodes the exchange costs one network round trip
more or less; the ratio here is a lower bound of that.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "examples")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ranks import free_port, spawn_ranks  # noqa: E402


def worker(rank: int, world: int, port: int, steps: int, hidden: int, folder: str) -> None:
    from ddp import MLP  # examples/ddp.py

    from advisor.agent.relay import CommandRelay
    from advisor.records.settings import MultinodeSettings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two ranks on a shared host: no oversubscription in the timings
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    gen = torch.Generator().manual_seed(rank)  # our own generator: the global ones stay untouched
    model = torch.nn.parallel.DistributedDataParallel(MLP(64, hidden, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    side = dist.new_group(backend="gloo")  # for the barriers the relay's steps are compared with
    relay = CommandRelay(rank=rank, local_rank=rank, world_size=world, settings=MultinodeSettings(heartbeat_s=1.0),
                         deliver=lambda c: None, emit=lambda n, d: None)
    # Blocks of steps with and without the exchange, alternated so load drift hits both alike.
    # A step's time runs to the end of the exchange: waiting there for the other rank is waiting
    # the next step's first all-reduce would otherwise do, so only the difference is the cost.
    relay.exchange(0)  # the first exchange makes the relay's group: not timed
    times: dict[str, list[float]] = {"without": [], "with": []}
    for block in range(2 * (steps // 20)):
        mode = "with" if block % 2 else "without"
        for _ in range(10):
            dist.barrier(group=side)
            t0 = time.perf_counter()
            x = torch.randn(32, 64, generator=gen)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if mode == "with":
                relay.exchange(0)
            else:
                dist.barrier(group=side)  # the same end: every rank done with its step
            times[mode].append(time.perf_counter() - t0)
    relay.close(0)
    Path(folder, f"rank{rank}.json").write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        results = [Path(folder, f"rank{r}.json") for r in range(2)]
        spawn_ranks(worker, (2, free_port(), args.steps, args.hidden, folder), 2, results)
        for rank, path in enumerate(results):
            data = json.loads(path.read_text())
            without, with_ = statistics.median(data["without"]), statistics.median(data["with"])
            print(f"rank {rank}: median step {without * 1e3:.2f} ms without the relay, {with_ * 1e3:.2f} ms with it "
                  f"(ratio {with_ / without:.3f}, {len(data['with'])} steps each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
