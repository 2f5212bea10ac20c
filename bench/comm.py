"""Overhead of the comm probe's interception, measured side by side in one run.

    python bench/comm.py

A gloo world of one in this process; times a small DDP training step and a bare
all_reduce loop with and without ``CommProbe`` attached, alternating rounds, and prints
the ratios (probe / bare). Figures only; nothing here is asserted.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]

from fakes import FakeContext  # noqa: E402

from advisor.probes.comm.probe import CommProbe  # noqa: E402


def _ddp_steps(ddp: torch.nn.Module, opt: torch.optim.Optimizer, probe: CommProbe | None, ctx: FakeContext, n: int) -> float:
    x = torch.randn(64, 256)
    t0 = time.perf_counter()
    for i in range(n):
        for phase in ("forward", "backward", "optimizer"):
            if probe:
                probe.on_phase(ctx, phase, time.perf_counter())
            if phase == "forward":
                loss = ddp(x).square().mean()
            elif phase == "backward":
                loss.backward()
            else:
                opt.step()
                opt.zero_grad()
        if probe:
            probe.on_step_end(ctx, i)
            ctx.step += 1
    return (time.perf_counter() - t0) / n


def main() -> int:
    torch.set_num_threads(1)
    store = Path(tempfile.mkdtemp()) / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    ctx = FakeContext([model])
    bare, probed, call_bare, call_probed = [], [], [], []
    t = torch.ones(16)
    for _ in range(5):
        bare.append(_ddp_steps(ddp, opt, None, ctx, 20))
        t0 = time.perf_counter()
        for _ in range(500):
            dist.all_reduce(t)
        call_bare.append((time.perf_counter() - t0) / 500)
        probe = CommProbe()
        probe.attach(ctx)
        probed.append(_ddp_steps(ddp, opt, probe, ctx, 20))
        t0 = time.perf_counter()
        for _ in range(500):
            dist.all_reduce(t)
        call_probed.append((time.perf_counter() - t0) / 500)
        probe.on_step_end(ctx, ctx.step)
        probe.detach(ctx)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    print(f"DDP step (8x Linear 256, {sum(p.numel() for p in model.parameters())} params, world of 1 gloo)")
    print(f"  bare {med(bare) * 1e3:.3f} ms   with CommProbe {med(probed) * 1e3:.3f} ms   ratio {med(probed) / med(bare):.3f}")
    print("small all_reduce call")
    print(f"  bare {med(call_bare) * 1e6:.1f} us   with CommProbe {med(call_probed) * 1e6:.1f} us   "
          f"overhead {(med(call_probed) - med(call_bare)) * 1e6:.1f} us per call")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
