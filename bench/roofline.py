"""Deep-sampling overhead of the compute probe, and (on a GPU) measured ceilings vs the spec table.

    python bench/roofline.py [--device cpu|cuda] [--steps 5]

Prints, measured side by side in one run on a small GPT-like model: the median
light step, the counted step (dispatch mode) and the timed step (profiler) as
ratios to the light step, and the share of the timed step's forward+backward
covered by op records. On CUDA it then prints the micro-benchmarked ceilings
against the datasheet entry.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fakes import FakeContext  # noqa: E402

from advisor.probes.compute import ComputeProbe  # noqa: E402
from advisor.probes.device.spec import detect_device_spec  # noqa: E402


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=5, help="light steps timed for the median")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    d, layers, seq, batch = (256, 4, 128, 8) if device.type == "cpu" else (1024, 8, 1024, 8)
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(d, 8) for _ in range(layers))).to(device)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(batch, seq, d, device=device)
    ctx = FakeContext([model], [opt])
    ctx.device = device
    probe = ComputeProbe()

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        ctx.phase = "forward"
        loss = model(x).square().mean()
        ctx.phase = "backward"
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        fb = time.perf_counter() - t0
        ctx.phase = "optimizer"
        opt.step()
        opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        ctx.phase = "data"
        return fb, time.perf_counter() - t0

    for _ in range(2):
        step()  # warm-up, including the dispatch mode's first-use imports
    probe.start_deep(ctx, 0)
    step()
    probe.stop_deep(ctx, 0)
    probe.start_deep(ctx, 1)
    step()
    probe.stop_deep(ctx, 1)
    ctx.emitted.clear()
    light, counted, timed = [], [], []
    for i in range(args.steps):  # interleaved so load changes hit all three alike
        light.append(step()[1])
        ctx.step = 10 + 2 * i
        probe.start_deep(ctx, ctx.step)
        counted.append(step()[1])
        probe.stop_deep(ctx, ctx.step)
        probe.start_deep(ctx, ctx.step + 1)
        fb, total = step()
        probe.stop_deep(ctx, ctx.step + 1)
        timed.append(total)
        if i == args.steps - 1:
            ops = [r for r in ctx.emitted if r.KIND == "op" and r.step == ctx.step + 1]
            covered = sum(r.time_s for r in ops if r.phase in ("forward", "backward")) / fb
            flops = sum(r.flops for r in ops)
    base = statistics.median(light)
    print(f"device {device}, {layers} blocks d={d} seq={seq} batch={batch}")
    print(f"light step            {1e3 * base:9.1f} ms   1.00x")
    print(f"counted step (mode)   {1e3 * statistics.median(counted):9.1f} ms   "
          f"{statistics.median(counted) / base:.2f}x")
    print(f"timed step (profiler) {1e3 * statistics.median(timed):9.1f} ms   "
          f"{statistics.median(timed) / base:.2f}x")
    print(f"op time / fwd+bwd time on the timed step: {covered:.3f}")
    print(f"FLOPs per step {flops:.3e}; achieved {flops / base:.3e} FLOP/s on the light step")

    spec = detect_device_spec(device)
    print(f"\n{spec.name}: source {spec.source}, part {spec.part}")
    for key in sorted(set(spec.spec_peak_flops) | set(spec.measured_peak_flops)):
        s, m = spec.spec_peak_flops.get(key), spec.measured_peak_flops.get(key)
        ratio = f"{m / s:.2f}" if s and m else "-"
        shown = f"{m:10.3e}" if m else f"{'not measured':>10s}"  # fp64/fp8 have no micro-benchmark
        print(f"  {key:5s} spec {s or 0:10.3e}  measured {shown} FLOP/s  measured/spec {ratio}")
    s, m = spec.spec_memory_bandwidth, spec.measured_memory_bandwidth
    print(f"  bandwidth spec {s or 0:10.3e}  measured {m or 0:10.3e} B/s  "
          f"measured/spec {m / s if s and m else float('nan'):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
