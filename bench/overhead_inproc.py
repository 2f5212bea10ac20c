"""The agent's light-path overhead measured inside one process, beyond noise.

    python bench/overhead_inproc.py                       # MLP (~20 ms step) and examples/gpt.py, 1 thread
    python bench/overhead_inproc.py --threads 0           # torch's default thread count
    python bench/overhead_inproc.py --model mlp --blocks 40 --block-steps 12
    python bench/overhead_inproc.py --device cuda --threads 0   # a GPU: every step ends in a synchronize

One process, one model, one optimizer. Blocks of ``--block-steps`` training steps alternate
between the agent's global hooks *installed* (with the enabled probes built as ``advisor attach``
builds them, and every record handed to a real ``AgentChannel`` whose sender thread encodes it as
JSON and writes it to ``os.devnull``: the thread's share of the GIL is part of the cost) and *not
installed*; the pair order
flips every other pair (ABBA) so drift hits both sides alike. Each block's figure is the median of
its step times (``time.perf_counter()`` around one whole loop iteration), leaving out the first two
steps of the block (hook installation, caches). The overhead of a pair is agent / bare; printed are
the median ratio over pairs with a 95% bootstrap confidence interval (resampling pairs).

Deep probes are switched off for the light-path figure (``deep_steps=[]``). The deep-step cost is
measured separately: a block with every probe, where the agent deep-samples steps 5-7 (the default
run's shape, 1-3, after a warm-up); printed is each deep iteration's time over the median light
iteration with the probes that ran on it (target <= 3x for every one), and what the set-up at the
boundary before the first deep step adds to the light iteration that holds it.

Targets (issue 14): light overhead <= 1.03 with the interval's upper end below 1.05.
Nothing here touches a global random generator: batches come from a private ``torch.Generator``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.agent.agent import Agent  # noqa: E402
from advisor.agent.channel import AgentChannel  # noqa: E402
from advisor.agent.hooks import install  # noqa: E402
from advisor.agent.probe_registry import build_probes  # noqa: E402
from advisor.records.samples import StepSample  # noqa: E402
from advisor.records.settings import AgentSettings  # noqa: E402

Step = Callable[[], None]


def _finish(device: torch.device) -> Callable[[], None]:
    """What ends a timed step: on CUDA a synchronize (the kernels, not their launches, are the
    step; both sides of a pair pay it alike), elsewhere nothing."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def mlp_step(hidden: int, layers: int, batch: int, device: torch.device = torch.device("cpu")) -> Step:
    """A plain MLP step: fp32, AdamW, random batches from a private generator."""
    gen = torch.Generator().manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(hidden, 1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    finish = _finish(device)

    def step() -> None:
        x = torch.randn(batch, hidden, generator=gen).to(device, non_blocking=True)
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        finish()

    return step


def gpt_step(args: list[str], device: torch.device = torch.device("cpu")) -> Step:
    """examples/gpt.py's model and batches, driven by this loop."""
    spec = importlib.util.spec_from_file_location("bench_gpt_example", ROOT / "examples" / "gpt.py")
    gpt = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = gpt  # its dataclasses look their module up
    spec.loader.exec_module(gpt)
    ns = gpt.parse_args(args)
    cfg = gpt.GPTConfig(vocab=ns.vocab, seq=ns.seq, layers=ns.layers, hidden=ns.hidden, heads=ns.heads)
    gen = torch.Generator().manual_seed(ns.seed)
    model = gpt.GPT(cfg).to(device)
    opt = gpt.make_optimizer(ns.optimizer, model.parameters(), ns.lr)
    finish = _finish(device)

    def step() -> None:
        x, y = (t.to(device, non_blocking=True) for t in gpt.synthetic_batch(gen, cfg, ns.batch))
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        finish()

    return step


class _Sink(list):
    """The records emitted, and the channel they went through (closed with the agent)."""

    channel: AgentChannel


def make_agent(probes: str, deep: bool) -> tuple[Agent, _Sink]:
    """An agent as ``advisor attach`` builds it; every record goes through an ``AgentChannel``
    (no controller: its sender spills them, JSON-encoded, to ``os.devnull``) and into a list."""
    names = [] if probes == "none" else ["memory", "compute", "comm"]
    settings = AgentSettings(probes=tuple(names), deep_steps=(), deep_every=0)
    built, warnings = build_probes(settings)
    if warnings:
        print("\n".join(warnings), file=sys.stderr)
    sink = _Sink()
    sink.channel = AgentChannel(None, b"bench", spill_path=os.devnull)

    def emit(record) -> None:  # what bootstrap's emit does on the training thread
        sink.channel.emit_record(record)
        sink.append(record)  # the record itself: nothing encoded here that bootstrap does not

    agent = Agent(emit=emit, settings=settings, probes=built)
    agent.attach_probes()
    return agent, sink


def timed_block(step: Step, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def bootstrap_ci(ratios: list[float], reps: int = 4000) -> tuple[float, float]:
    rng = np.random.default_rng(12345)  # private generator: never the global one
    arr = np.asarray(ratios)
    meds = np.median(rng.choice(arr, size=(reps, arr.size), replace=True), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def light_overhead(step: Step, probes: str, blocks: int, block_steps: int) -> dict[str, float]:
    agent, sink = make_agent(probes, deep=False)
    hooks = None
    ratios = []
    for _ in range(3):  # warm-up: allocator, threads, lazy imports of the first optimizer step
        step()
    try:
        for pair in range(blocks):
            order = ("bare", "agent") if pair % 4 in (0, 3) else ("agent", "bare")
            medians = {}
            for side in order:
                if side == "agent":
                    hooks = install(agent)
                times = timed_block(step, block_steps)
                if side == "agent":
                    hooks.remove()
                    hooks = None
                    sink.clear()
                medians[side] = statistics.median(times[2:])
            ratios.append(medians["agent"] / medians["bare"])
    finally:
        if hooks is not None:
            hooks.remove()
        agent.close()
        sink.channel.close()
    low, high = bootstrap_ci(ratios)
    return {"median": statistics.median(ratios), "low": low, "high": high, "pairs": len(ratios)}


def deep_run(step: Step, steps: int, deep_at: tuple[int, ...],
             run_one: Callable[[int], float] | None = None) -> tuple[list[float], dict[int, list[str]]]:
    """``steps`` iterations under an agent with every probe that deep-samples ``deep_at``, after a
    warm-up: each iteration's seconds (``run_one(i)`` runs and times iteration i; by default a
    clock around the step) and, for each deep step, the probes that ran on it."""
    agent, sink = make_agent("all", deep=True)
    agent.deep.steps = set(deep_at)
    for _ in range(3):
        step()
    hooks = install(agent)
    try:
        times = [run_one(i) for i in range(steps)] if run_one else timed_block(step, steps)
        agent.flush(sync=True)
    finally:
        hooks.remove()
        agent.close()
        sink.channel.close()
    deep = {r.index: r.deep_probes or [] for r in sink if type(r) is StepSample and r.deep}
    return times, deep


def deep_cost(step: Step, steps: int, deep_at: tuple[int, ...]) -> dict[str, Any]:
    """Each deep iteration's time over the median light one, with the probes that ran on it (the
    compute probe takes steps of its own), and what the set-up at the boundary before the first
    deep step adds to the light iteration that holds it."""
    times, deep = deep_run(step, steps, deep_at)
    # Iteration i runs step i; the deep probes start at the boundary ending step i-1 (inside
    # iteration i-1) and stop at the boundary ending step i (inside iteration i).
    light = [t for i, t in enumerate(times) if i not in deep and i + 1 not in deep and i >= 2]
    base = statistics.median(light)
    per_step = [(i, deep[i], times[i] / base) for i in sorted(deep) if i < len(times)]
    setup = [times[i - 1] / base - 1.0 for i in sorted(deep) if 1 <= i <= len(times) and i - 1 not in deep]
    ratios = [r for _, _, r in per_step]
    return {"light_s": base, "deep_over_light": statistics.median(ratios) if ratios else float("nan"),
            "worst": max(ratios) if ratios else float("nan"), "per_step": per_step,
            "setup_over_light": max(setup) if setup else float("nan"), "deep_steps": len(ratios)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["mlp", "gpt", "both"], default="both")
    p.add_argument("--threads", type=int, default=1, help="torch threads; 0 keeps torch's default")
    p.add_argument("--blocks", type=int, default=24, help="pairs of blocks (agent, bare)")
    p.add_argument("--block-steps", type=int, default=10)
    p.add_argument("--probes", choices=["all", "none", "both"], default="both")
    p.add_argument("--mlp", default="1024,4,128", help="hidden,layers,batch of the MLP")
    p.add_argument("--gpt-args", default="", help="arguments for examples/gpt.py's model")
    p.add_argument("--device", default="cpu", help="cpu or cuda (each step ends in a synchronize there)")
    ns = p.parse_args(argv)
    device = torch.device(ns.device)
    if ns.threads:
        torch.set_num_threads(ns.threads)
    models = ["mlp", "gpt"] if ns.model == "both" else [ns.model]
    probe_sets = ["none", "all"] if ns.probes == "both" else [ns.probes]
    print(f"torch {torch.__version__}, {device}, threads {torch.get_num_threads()}, "
          f"{ns.blocks} pairs x {ns.block_steps} steps")
    print(f"{'model':6} {'probes':6} {'step':>9} {'median':>7} {'95% CI':>15}  target <= 1.03, CI high < 1.05")
    for name in models:
        if name == "mlp":
            hidden, layers, batch = (int(v) for v in ns.mlp.split(","))
            step = mlp_step(hidden, layers, batch, device)
        else:
            step = gpt_step(ns.gpt_args.split(), device)
        base = statistics.median(timed_block(step, 8)[3:])
        for probes in probe_sets:
            r = light_overhead(step, probes, ns.blocks, ns.block_steps)
            ok = "ok" if r["median"] <= 1.03 and r["high"] < 1.05 else "MISSED"
            print(f"{name:6} {probes:6} {base * 1e3:7.1f}ms {r['median']:7.3f} "
                  f"[{r['low']:.3f}, {r['high']:.3f}]  {ok}")
        d = deep_cost(step, 16, (5, 6, 7))  # the default run's shape: 1-3, here after a warm-up
        steps_text = ", ".join(f"{i} {'+'.join(probes) or '-'} {r:.2f}x" for i, probes, r in d["per_step"])
        print(f"{name:6} deep   {d['light_s'] * 1e3:7.1f}ms deep/light median {d['deep_over_light']:.2f}x, "
              f"worst {d['worst']:.2f}x (target <= 3x) [{steps_text}]; the set-up before the first adds "
              f"{d['setup_over_light']:+.2f} of a light step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
