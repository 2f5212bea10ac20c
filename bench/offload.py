"""Predicted against measured peak and step time: checkpoint-only, offload-only and the joint plan.

    python bench/offload.py                              # CPU, examples/gpt.py's default model
    python bench/offload.py --device cuda --layers 8 --hidden 1024 --seq 1024 --batch 8

In one process, on examples/gpt.py's model:
1. The chain: per block, the bytes autograd saves inside it (a counting pack hook, weights
   excluded) and its forward seconds; the unconstrained peak P of one training step (CUDA:
   ``torch.cuda.max_memory_allocated``; CPU: the memory tracker's device-category peak, since a
   CPU offload's host copies are the ``offloaded_host`` category and never a device budget's).
   The chain is calibrated so its no-remedy peak is P. The memory probe records the op-by-op
   timeline of one unremedied step (``advisor.agent`` with a deep step, as ``advisor attach``
   does), which ``recommend/peak_model.py`` replays for any keep / recompute / offload choice.
2. For budgets B = f x P (``--budgets``, default 0.5, 0.7, 0.9) and each strategy, the solver's
   plan (``recommend/remedies/offload.solve`` over the simulated timeline) is applied (``apply_activation_offload`` with its
   recomputed blocks as ``checkpoint``, or ``apply_activation_checkpointing`` alone), one step
   warms up, then the peak of one step and the median time of ``--steps`` steps are measured,
   and the plan is reverted.
Printed per row: budget, strategy, blocks recomputed/offloaded, predicted (simulated timeline)
and measured peak and their ratio, the conservative chain formula's peak for the same plan and
its ratio, predicted and measured step time (and their ratio), whether it fits B.
The host-link figure is ``probes/device/hostlink.py``'s (on CPU a same-device copy).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from gpt import GPT, GPTConfig  # noqa: E402

from advisor.agent.agent import Agent  # noqa: E402
from advisor.agent.hooks import install  # noqa: E402
from advisor.agent.probe_registry import build_probes  # noqa: E402
from advisor.records.settings import AgentSettings  # noqa: E402
from advisor.apply.remedies.activation_checkpointing import apply_activation_checkpointing  # noqa: E402
from advisor.apply.remedies.activation_offload import apply_activation_offload  # noqa: E402
from advisor.probes.device.hostlink import host_link  # noqa: E402
from advisor.probes.memory.tracker import StorageTracker  # noqa: E402
from advisor.recommend.memory_model import Block, Chain  # noqa: E402
from advisor.recommend.peak_model import ChainMemory, chain_memory, module_figures  # noqa: E402
from advisor.recommend.remedies.offload import KEEP, OFFLOAD, RECOMPUTE, Model, evaluate, solve  # noqa: E402
from advisor.records.samples import MemorySample, ModuleStat  # noqa: E402

STRATEGIES = {"checkpoint-only": (KEEP, RECOMPUTE), "offload-only": (KEEP, OFFLOAD),
              "joint": (KEEP, RECOMPUTE, OFFLOAD)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step(model, opt, x, y, vocab) -> None:
    loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()


def peak_of_step(model, opt, x, y, vocab, device) -> int:
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        step(model, opt, x, y, vocab)
        sync(device)
        return torch.cuda.max_memory_allocated(device)
    tracker = StorageTracker(device_type="cpu")
    tracker.start()
    try:
        tracker.add_existing(list(model.parameters()) + [x, y])
        tracker.refresh_roles([model], [opt])
        tracker.set_step(1)
        tracker.phase = "forward"
        tracker.on_op = lambda op, module: None
        tracker.reset_peak()
        step(model, opt, x, y, vocab)
        return tracker.peak_total  # the device's: the host copies (offloaded_host) are not in it
    finally:
        tracker.stop()


def step_time(model, opt, x, y, vocab, device, steps: int) -> float:
    times = []
    for _ in range(steps):
        sync(device)
        start = time.perf_counter()
        step(model, opt, x, y, vocab)
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_chain(model, x, device) -> tuple[Block, ...]:
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    h = model.tok_emb(x) + model.pos_emb(torch.arange(x.shape[1], device=device))
    out_blocks = []
    for i, block in enumerate(model.blocks):
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = t.untyped_storage()._cdata
            if key not in params:
                seen[key] = t.untyped_storage().nbytes()
            return t.detach()  # the tensor itself would tie an output to its own node: a leak

        sync(device)
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = block(h)
        sync(device)
        out_blocks.append(Block(name=f"blocks.{i}", activation_bytes=sum(seen.values()),
                                input_bytes=h.numel() * h.element_size(), output_bytes=out.numel() * out.element_size(),
                                forward_s=time.perf_counter() - start))
        h = out
    return tuple(out_blocks)


def record_timeline(model, opt, x, y, vocab, names: list[str]) -> ChainMemory:
    """Three steps under the agent's memory probe, the middle one deep-sampled: its timeline."""
    records: list = []
    settings = AgentSettings(probes=("memory",), deep_steps=(1,))
    probes, warnings = build_probes(settings)
    if warnings:
        raise SystemExit(f"memory probe unavailable: {warnings}")
    agent = Agent(emit=records.append, settings=settings, probes=probes)
    agent.attach_probes()
    hooks = install(agent)
    try:
        for _ in range(3):
            gc.collect()
            step(model, opt, x, y, vocab)
        agent.flush(sync=True)
    finally:
        hooks.remove()
        agent.close()
    samples = [r for r in records if isinstance(r, MemorySample) and r.step == 1]
    stats = [r for r in records if isinstance(r, ModuleStat) and r.step == 1]
    memory = chain_memory(samples, names, *module_figures(stats))
    if memory is None:
        raise SystemExit("the deep step's timeline did not cover the chain once forward and once backward")
    return memory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budgets", default="0.5,0.7,0.9")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = GPTConfig(layers=args.layers, hidden=args.hidden, seq=args.seq, heads=4, vocab=512)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab, (args.batch, cfg.seq), generator=g).to(device)
    y = torch.randint(0, cfg.vocab, (args.batch, cfg.seq), generator=g).to(device)
    step(model, opt, x, y, cfg.vocab)  # optimizer state exists from here on
    blocks = measure_chain(model, x, device)
    gc.collect()
    memory = record_timeline(model, opt, x, y, cfg.vocab, [b.name for b in blocks])
    gc.collect()
    peak = peak_of_step(model, opt, x, y, cfg.vocab, device)
    base_time = step_time(model, opt, x, y, cfg.vocab, device, args.steps)
    chain = Chain(blocks=blocks, fixed_bytes=max(0, peak - sum(b.activation_bytes for b in blocks)),
                  baseline_step_time_s=base_time)
    link = host_link(device)
    jm = Model(bandwidth=link["host_link_bandwidth"], overlap=device.type == "cuda")  # CPU copies run inline
    print(f"device {device}; unconstrained peak {peak / 2**20:.1f} MiB; step {base_time * 1e3:.1f} ms; "
          f"host link {link['host_link_bandwidth'] / 1e9:.1f} GB/s ({link['host_link_source']}); "
          f"timeline's unremedied peak {memory.measured_peak_bytes / 2**20:.1f} MiB")
    print(f"{'budget':>7} {'strategy':>16} {'R/O':>5} {'pred MiB':>9} {'meas MiB':>9} {'ratio':>6} "
          f"{'formula':>8} {'ratio':>6} {'pred ms':>8} {'meas ms':>8} {'ratio':>6} fits")
    for frac in (float(f) for f in args.budgets.split(",")):
        budget = int(frac * peak)
        for label, allowed in STRATEGIES.items():
            plan = solve(chain, jm, budget, allowed=allowed, optimizer=False, memory=memory)
            formula = evaluate(chain, jm, plan.choices, False)[0]
            offloaded = plan.blocks(chain, OFFLOAD)
            recomputed = plan.blocks(chain, RECOMPUTE)
            # The unremedied step timed again just before the plan: side by side, as the machine
            # drifts (a process's first steps run slower than its later ones).
            before_s = step_time(model, opt, x, y, cfg.vocab, device, args.steps)
            if offloaded:
                handle = apply_activation_offload(model, modules=offloaded, checkpoint=recomputed, min_bytes=0)
            elif recomputed:
                handle = apply_activation_checkpointing(model, modules=recomputed)
            else:
                handle = None
            try:
                step(model, opt, x, y, cfg.vocab)
                gc.collect()  # a checkpoint's graph may keep the last step's tensors in a cycle
                measured = peak_of_step(model, opt, x, y, cfg.vocab, device)
                seconds = step_time(model, opt, x, y, cfg.vocab, device, args.steps)
            finally:
                if handle is not None:
                    handle.revert()
            predicted_s = before_s + plan.overhead_s
            note = "" if plan.feasible else " (no plan fits: lowest peak)"
            print(f"{frac:>7.0%} {label:>16} {len(recomputed)}/{len(offloaded):<3} {plan.peak_bytes / 2**20:>9.1f} "
                  f"{measured / 2**20:>9.1f} {plan.peak_bytes / measured:>6.2f} {formula / 2**20:>8.1f} "
                  f"{formula / measured:>6.2f} {predicted_s * 1e3:>8.1f} "
                  f"{seconds * 1e3:>8.1f} {predicted_s / seconds:>6.2f} {'yes' if measured <= budget else 'no'}{note}")


if __name__ == "__main__":
    main()
