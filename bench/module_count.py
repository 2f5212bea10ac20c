"""Cost that grows with the number of modules: bare against ``advisor attach --headless``.

    python bench/module_count.py                       # 100, 1000, 5001 modules, 12 steps, 3 alternations
    python bench/module_count.py --sizes 5001 --reps 5

For each size, ``python bench/models/many_modules.py --modules N --steps S`` runs bare and under
``python -m advisor attach --headless --json R bench/models/many_modules.py ...`` (default probes),
alternating the two ``--reps`` times. Per run: the whole command's wall time (what the user
waits for), the script's own loop time (``train s``), the training process's peak RSS (the
script's ``ru_maxrss``), and its steps' own times (``step N loss X s T``), split by the attached
run's report into light steps (not deep, not block-timed, not step 0 nor a step right after a
deep one) and deep steps, each over the bare run's median step from step 1. Printed per size:
the medians, and attached over bare for each (the median of the per-alternation ratios, with
their range). Targets (issue 37) at 5001 modules and
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
sys.path.insert(0, str(ROOT / "bench"))
from overhead import report_steps  # noqa: E402  (a run's deep and block-timed steps, from its report)
SCRIPT = ROOT / "bench" / "models" / "many_modules.py"
FIGURE = re.compile(r"^(train s|peak rss) (\S+)")
STEP = re.compile(r"^step (\d+) loss \S+ s (\S+)")


def run(cmd: list[str], env: dict[str, str], report: Path | None = None) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[1:])} exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    lines = proc.stdout.splitlines()
    figures = {m.group(1): float(m.group(2)) for line in lines if (m := FIGURE.match(line))}
    steps = {int(m.group(1)): float(m.group(2)) for line in lines if (m := STEP.match(line))}
    out = {"wall": wall, "train": figures["train s"], "rss": figures["peak rss"] * 1024}
    if report is None:
        out["light"] = statistics.median(t for i, t in steps.items() if i >= 1)
        return out
    deep, timed = report_steps(report)
    # Ordinary steps: not step 0, not deep, not block-timed, not right after a deep step.
    light = [t for i, t in steps.items() if i >= 1 and i not in deep and i not in timed and i - 1 not in deep]
    out["light"] = statistics.median(light)
    out["deep"] = statistics.median(steps[i] for i in deep if i in steps) if deep else float("nan")
    return out


def ratio_text(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100,1000,5001", help="module counts (default 100,1000,5001)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    print("| modules | bare wall | attached wall | wall ratio | loop ratio | light step ratio | deep step ratio | "
          "bare RSS | attached RSS | RSS ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="advisor-modules-") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ADVISOR_HOME": str(Path(tmp) / "home"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        for n in sizes:
            script = [str(SCRIPT), "--modules", str(n), "--steps", str(args.steps)]
            bare, attached = [], []
            for rep in range(args.reps):
                report = Path(tmp) / f"r{n}-{rep}.json"
                pair = [("bare", [sys.executable, *script]),
                        ("attached", [sys.executable, "-m", "advisor", "attach", "--headless", "--json",
                                      str(report), *script])]
                for kind, cmd in (pair if rep % 2 == 0 else pair[::-1]):  # alternate which runs first
                    if kind == "bare":
                        bare.append(run(cmd, env))
                    else:
                        attached.append(run(cmd, env, report))
            ratios = {k: [a[k] / b[k] for a, b in zip(attached, bare)] for k in ("wall", "train", "rss")}
            ratios["light"] = [a["light"] / b["light"] for a, b in zip(attached, bare)]
            ratios["deep"] = [a["deep"] / b["light"] for a, b in zip(attached, bare)]
            med = {k: (statistics.median(r[k] for r in bare), statistics.median(r[k] for r in attached))
                   for k in ("wall", "rss")}
            print(f"| {n} | {med['wall'][0]:.1f} s | {med['wall'][1]:.1f} s | {ratio_text(ratios['wall'])} | "
                  f"{ratio_text(ratios['train'])} | {ratio_text(ratios['light'])} | {ratio_text(ratios['deep'])} | "
                  f"{med['rss'][0] / 2**20:.0f} MiB | {med['rss'][1] / 2**20:.0f} MiB | "
                  f"{ratio_text(ratios['rss'])} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
