"""How much of examples/gpt.py's forward+backward time the report's ops cover, by model size.

    python bench/op_coverage.py [--repeats 2]

For each size it runs ``advisor attach --probes compute`` on examples/gpt.py and
prints the op time in the report over the timed deep steps' forward and backward
phase time. Beside it, measured in the same run, the ceiling: the same model
under PyTorch's profiler alone, no advisor, with every top-level aten op and
autograd node counted. Whatever neither covers is the script's own Python
between ops, which no op record can claim; it shrinks as ops grow.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import gpt  # noqa: E402

from advisor.probes.compute.timing import AUTOGRAD_NODE, outermost  # noqa: E402

SIZES = [("defaults", []), ("hidden 256", ["--hidden", "256"]), ("hidden 256 seq 128", ["--hidden", "256", "--seq", "128"])]


def advisor_coverage(args: list[str]) -> tuple[float, float, float, float]:
    """(forward, backward, total coverage, mean timed fwd+bwd seconds) from one CLI run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        run = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--probes", "compute",
                              "--steps", "6", "--json", str(out), "examples/gpt.py", *args],
                             cwd=ROOT, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(run.stderr[-2000:])
        report = json.loads(out.read_text())
    timed = report["compute"]["deep_steps"]
    steps = {s["index"]: s["phases"] for s in report["steps"] if s["rank"] == 0}
    fwd = sum(steps[i]["forward_s"] for i in timed) / len(timed)
    bwd = sum(steps[i]["backward_s"] for i in timed) / len(timed)
    by_phase = {p: sum(o["time_s"] for o in report["ops"] if o["phase"] == p) for p in ("forward", "backward")}
    return by_phase["forward"] / fwd, by_phase["backward"] / bwd, sum(by_phase.values()) / (fwd + bwd), fwd + bwd


def _parse(args: list[str]) -> gpt.GPTConfig:
    ns = gpt.parse_args(args)
    return gpt.GPTConfig(vocab=ns.vocab, seq=ns.seq, layers=ns.layers, hidden=ns.hidden, heads=ns.heads)


def profiler_ceiling(args: list[str], steps: int = 4) -> float:
    """Share of fwd+bwd inside top-level aten ops or autograd nodes, PyTorch's profiler alone."""
    torch.manual_seed(0)
    cfg = _parse(args)
    model, gen = gpt.GPT(cfg), torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        x, y = gpt.synthetic_batch(gen, cfg, 8)
        with torch.profiler.record_function("fwd_bwd"):
            F.cross_entropy(model(x).view(-1, cfg.vocab), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step()
    covered = total = 0.0
    for _ in range(steps):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        events = prof.events()
        mark = next(e for e in events if e.name == "fwd_bwd")
        total += mark.time_range.elapsed_us()
        for e in events:
            if _counts(e) and mark.time_range.start <= e.time_range.start <= mark.time_range.end:
                covered += e.time_range.elapsed_us()
    return covered / total


def _counts(event) -> bool:
    """A top-level op or node: nothing above it is one."""
    return event.name.startswith(("aten::", AUTOGRAD_NODE)) and outermost(event) is None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="CLI runs per size (the median is shown)")
    ns = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'size':20s} {'fwd+bwd ms':>10s} {'forward':>8s} {'backward':>9s} {'total':>7s} {'ceiling':>8s}")
    for label, args in SIZES:
        runs = [advisor_coverage(args) for _ in range(ns.repeats)]
        fwd, bwd, tot, secs = (statistics.median(r[k] for r in runs) for k in range(4))
        print(f"{label:20s} {secs * 1e3:10.1f} {fwd:8.3f} {bwd:9.3f} {tot:7.3f} {profiler_ceiling(args):8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
