"""Where a deep step's time goes: each deep iteration's wall time over a light one, and the
functions that took it (cProfile, by own time), for one model on one device.

    python bench/deep_profile.py                         # examples/gpt.py's defaults, CPU, one thread
    python bench/deep_profile.py --device cuda --gpt-args "--layers 8 --hidden 1024 --seq 1024 --batch 1"

The agent is built as ``bench/overhead_inproc.py`` builds it (every probe, records through an
``AgentChannel`` to nowhere) and deep-samples steps 5-7 after a warm-up, the default run's shape.
cProfile slows Python a little, so the ratios printed come from a first pass without it; the
profile from a second pass over the same steps, one profile per deep iteration.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from overhead_inproc import deep_cost, deep_run, gpt_step  # noqa: E402


DEEP_AT = (5, 6, 7)


def profiled(step, steps: int, top: int, callers: str | None = None) -> None:
    profiles: dict[int, cProfile.Profile] = {}

    def run_one(i: int) -> float:
        prof = cProfile.Profile() if i in DEEP_AT or i + 1 in DEEP_AT else None
        if prof:
            profiles[i] = prof
            prof.enable()
        t0 = time.perf_counter()
        step()
        elapsed = time.perf_counter() - t0
        if prof:
            prof.disable()
        return elapsed

    times, deep = deep_run(step, steps, DEEP_AT, run_one)
    light = statistics.median(t for i, t in enumerate(times) if i >= 2 and i not in profiles)
    for i in sorted(profiles):
        out = io.StringIO()
        pstats.Stats(profiles[i], stream=out).sort_stats("tottime").print_stats(top)
        body = out.getvalue()
        body = body[body.find("ncalls"):]
        print(f"\n== iteration {i} ({'+'.join(deep.get(i, [])) or 'set-up / light'}): "
              f"{times[i] * 1e3:.1f} ms, {times[i] / light:.2f}x a light step ({light * 1e3:.1f} ms; profiled)")
        print(body.rstrip())
        if callers:
            out = io.StringIO()
            pstats.Stats(profiles[i], stream=out).sort_stats("tottime").print_callers(callers)
            text = out.getvalue()
            print(text[text.find("Function"):].rstrip())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads; 0 keeps torch's default")
    p.add_argument("--gpt-args", default="")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--repeat", type=int, default=1, help="measure the ratios this many times (the first is cold)")
    p.add_argument("--no-profile", action="store_true", help="the ratios only")
    p.add_argument("--callers", help="also print who called the functions matching this pattern")
    ns = p.parse_args(argv)
    if ns.threads:
        torch.set_num_threads(ns.threads)
    step = gpt_step(ns.gpt_args.split(), torch.device(ns.device))
    for _ in range(ns.repeat):
        d = deep_cost(step, 16, DEEP_AT)
        print(f"torch {torch.__version__}, {ns.device}; light step {d['light_s'] * 1e3:.1f} ms; deep iterations "
              + ", ".join(f"{i} {'+'.join(pr) or '-'} {r:.2f}x" for i, pr, r in d["per_step"])
              + f"; the set-up before the first adds {d['setup_over_light']:+.2f}", flush=True)
    if not ns.no_profile:
        profiled(step, 12, ns.top, ns.callers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
