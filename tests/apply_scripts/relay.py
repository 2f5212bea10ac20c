"""Two gloo ranks driving the multi-node command relay (advisor/agent/relay.py) as agents would.

Rank 0's controller sends an apply command between the boundaries of steps 2 and 3; rank 1's
own controller sends a conflicting one, which must be ignored. Each rank exchanges at the
boundaries of steps 1..5 with the comm probe's interceptor installed, and writes
``rank<r>.json``: the commands delivered to it (with the step), the events it emitted, and how
many collectives the interceptor recorded during the exchanges (the relay's own must not count).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
for path in (str(ROOT), str(ROOT / "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

from advisor.agent.relay import CommandRelay  # noqa: E402
from advisor.probes.comm.intercept import CollectiveInterceptor  # noqa: E402
from advisor.records.settings import MultinodeSettings  # noqa: E402
from recommendations import wire  # noqa: E402

APPLY = {"type": "apply", "recommendation": wire("fused-optimizer", "fused_optimizer", params={"optimizers": None}),
         "at_step": 4, "measure_steps": 3}
CONFLICT = {"type": "revert"}


def worker(rank: int, world: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    delivered: list[dict] = []
    events: list[tuple[str, dict]] = []
    step = {"now": 0}
    relay = CommandRelay(rank=rank, local_rank=0, world_size=world, settings=MultinodeSettings(heartbeat_s=0.2, lost_after_s=5, timeout_s=60),
                         deliver=lambda c: delivered.append({"step": step["now"], "command": c}),
                         emit=lambda name, data: events.append((name, data)))
    interceptor = CollectiveInterceptor()
    interceptor.install()
    for s in range(1, 6):
        step["now"] = s
        if s == 3:  # both controllers "sent" something since the last boundary
            relay.submit(APPLY if rank == 0 else CONFLICT)
        relay.exchange(s)
    recorded = len(interceptor.calls)
    interceptor.uninstall()
    relay.close(0)
    result = {"delivered": delivered, "events": [[n, d] for n, d in events], "recorded": recorded}
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
