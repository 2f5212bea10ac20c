"""Cost that grows with the number of modules: bare against ``advisor attach --headless``.

    python bench/module_count.py                       # 100, 1000, 5001 modules, 12 steps, 3 alternations
    python bench/module_count.py --sizes 5001 --reps 5

For each size, ``python bench/models/many_modules.py --modules N --steps S`` runs bare and under
``python -m advisor attach --headless --json R bench/models/many_modules.py ...`` (default probes),
alternating the two ``--reps`` times. Per run: the whole command's wall time (what the user
waits for), the script's own loop time (``train s``), and the training process's peak RSS (the
script's ``ru_maxrss``). Printed per size: the medians, and attached over bare for each (the
median of the per-alternation ratios, with their range). Targets (issue 37) at 5001 modules and
12 steps: wall <= 2x, peak RSS <= 1.5x. Every process runs with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "models" / "many_modules.py"
FIGURE = re.compile(r"^(train s|peak rss) (\S+)")


def run(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[1:])} exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    figures = {m.group(1): float(m.group(2)) for line in proc.stdout.splitlines() if (m := FIGURE.match(line))}
    return {"wall": wall, "train": figures["train s"], "rss": figures["peak rss"] * 1024}


def ratio_text(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100,1000,5001", help="module counts (default 100,1000,5001)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    print("| modules | bare wall | attached wall | wall ratio | loop ratio | bare RSS | attached RSS | RSS ratio |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="advisor-modules-") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ADVISOR_HOME": str(Path(tmp) / "home"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        for n in sizes:
            script = [str(SCRIPT), "--modules", str(n), "--steps", str(args.steps)]
            bare, attached = [], []
            for rep in range(args.reps):
                pair = [("bare", [sys.executable, *script]),
                        ("attached", [sys.executable, "-m", "advisor", "attach", "--headless", "--json",
                                      str(Path(tmp) / f"r{n}-{rep}.json"), *script])]
                for kind, cmd in (pair if rep % 2 == 0 else pair[::-1]):  # alternate which runs first
                    (bare if kind == "bare" else attached).append(run(cmd, env))
            ratios = {k: [a[k] / b[k] for a, b in zip(attached, bare)] for k in ("wall", "train", "rss")}
            med = {k: (statistics.median(r[k] for r in bare), statistics.median(r[k] for r in attached))
                   for k in ("wall", "rss")}
            print(f"| {n} | {med['wall'][0]:.1f} s | {med['wall'][1]:.1f} s | {ratio_text(ratios['wall'])} | "
                  f"{ratio_text(ratios['train'])} | {med['rss'][0] / 2**20:.0f} MiB | {med['rss'][1] / 2**20:.0f} MiB | "
                  f"{ratio_text(ratios['rss'])} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
