"""Memory probe accuracy against analytic counts, and its cost, measured side by side.

    python bench/memory_accuracy.py

Drives MemoryProbe by hand (tests/fakes.FakeContext) around examples/gpt.py's GPT with Adam:
prints tracked parameter / gradient / optimizer-state bytes against 4Ψ / 4Ψ / 8Ψ + 4·tensors,
each block's saved activations against REFERENCE.md's per-layer formula (Korthikanti et al.,
s·b·h·(34 + 5·a·s/h) bytes at 16 bits, doubled for fp32; the formula counts dropout masks and
assumes ops the example may not have, so the gap is printed, not asserted), and the step-time
ratios of light and deep steps to steps without the probe.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from fakes import FakeContext  # noqa: E402

from advisor.probes.memory import MemoryProbe  # noqa: E402


def load_gpt():
    spec = importlib.util.spec_from_file_location("example_gpt", ROOT / "examples" / "gpt.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["example_gpt"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.GPT, module.GPTConfig


def main() -> int:
    GPT, GPTConfig = load_gpt()
    cfg = GPTConfig()
    batch = 8
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ctx = FakeContext([model], [opt])
    probe = MemoryProbe()
    probe.attach(ctx)

    def step(*, deep: bool, with_probe: bool = True) -> float:
        start = time.perf_counter()
        ctx.step_start = start
        if deep:
            probe.start_deep(ctx, ctx.step)
        for phase in ("data", "forward", "backward", "optimizer", "other"):
            ctx.phase = phase
            if with_probe:
                probe.on_phase(ctx, phase, time.perf_counter())
            if phase == "data":
                idx = torch.randint(0, cfg.vocab, (batch, cfg.seq))
                targets = torch.randint(0, cfg.vocab, (batch, cfg.seq))
            elif phase == "forward":
                logits = model(idx)
                loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1))
            elif phase == "backward":
                loss.backward()
            elif phase == "optimizer":
                opt.step()
                opt.zero_grad()
        if deep:
            probe.stop_deep(ctx, ctx.step)
        if with_probe:
            probe.on_step_end(ctx, ctx.step)
        ctx.step += 1
        return time.perf_counter() - start

    step(deep=False)  # warm-up: lazy imports, optimizer state
    step(deep=True)
    deep_step = ctx.step - 1
    samples = [s for s in ctx.of_kind("memory") if s.step == deep_step]
    cmax = {c: max(s.categories[c] for s in samples) for c in samples[0].categories}
    psi = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    expected = {"parameter": 4 * psi, "gradient": 4 * psi, "optimizer_state": 8 * psi + 4 * tensors}
    print(f"GPT {cfg}, batch {batch}, Ψ = {psi}")
    for name, want in expected.items():
        got = cmax[name]
        print(f"  {name:16s} tracked {got:>12d}  analytic {want:>12d}  error {(got - want) / want:+.4%}")
    event = [e for e in ctx.of_kind("event") if e.name == "module_activations"][-1]
    s, b, h, a = cfg.seq, batch, cfg.hidden, cfg.heads
    formula = 2 * s * b * h * (34 + 5 * a * s / h)  # x2: fp32 instead of 16-bit
    for i in range(cfg.layers):
        got = event.data["inclusive_bytes"].get(f"blocks.{i}", 0)
        print(f"  blocks.{i} saved {got:>10d}  formula(fp32) {formula:>12.0f}  error {(got - formula) / formula:+.1%}")

    rounds = 5
    plain, light, deep = [], [], []
    for _ in range(rounds):  # interleaved so drift hits all three alike
        plain.append(step(deep=False, with_probe=False))
        light.append(step(deep=False))
        deep.append(step(deep=True))
    base = statistics.median(plain)
    print(f"step time without probe {base * 1e3:.1f} ms (median of {rounds})")
    print(f"  light step / no probe: {statistics.median(light) / base:.3f}  (target <= 1.03)")
    print(f"  deep step  / no probe: {statistics.median(deep) / base:.2f}")
    probe.detach(ctx)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
