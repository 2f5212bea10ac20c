"""Predicted against measured step time: every example with its top live recommendation applied.

    python bench/advice.py                    # the four examples, a few minutes on 2 cores
    python bench/advice.py --steps 30 --only slow_input.py,gpt.py

For each example (``examples/cnn.py``, ``gpt.py``, ``ddp.py`` on 2 ranks, ``slow_input.py``):
``python -m advisor attach --headless --apply auto --allow-inexact --apply-at-step 5 --steps S
--json R examples/X.py --steps S``. The advisor applies its top live recommendation (any apply
class: ``--allow-inexact``) at step 5, measures it, and keeps or reverts it. Printed as each run
ends: the final diagnosis (advised on the steps after the apply), the remedy applied and its
status, the predicted step time, the measured step time before and after (the
executor's windows: ``report["applied"][0]["measured"]``), and the relative error of the
prediction against the measured after, ``(predicted - after) / after``.

Every process runs with ``OMP_NUM_THREADS=1`` (``--threads``; bench/overhead.py: on a shared
2-core machine two OpenMP threads make step times swing) and ``ADVISOR_HOME`` in a temporary
folder, so nothing is written to the user's sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES: dict[str, list[str]] = {  # script -> extra attach options
    "cnn.py": [],
    "gpt.py": [],
    "ddp.py": ["--nproc-per-node", "2"],
    "slow_input.py": [],
}


def run(script: str, extra: list[str], steps: int, threads: int, home: str) -> tuple[dict | None, str, float]:
    out = Path(home) / f"{script}.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "ADVISOR_HOME": home}
    cmd = [sys.executable, "-m", "advisor", "attach", "--headless", "--apply", "auto", "--allow-inexact",
           "--apply-at-step", "5", "--steps", str(steps), *extra, "--json", str(out),
           f"examples/{script}", "--steps", str(steps)]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=1200)
    wall = time.perf_counter() - start
    if done.returncode != 0 or not out.exists():
        return None, done.stderr[-600:], wall
    return json.loads(out.read_text()), "", wall


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:8.1f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", default="", help="comma-separated example file names")
    args = p.parse_args(argv)
    chosen = [s for s in EXAMPLES if not args.only or s in args.only.split(",")]
    print(f"{'example':<14} {'remedy':<22} {'status':<9} {'predicted':>11} "
          f"{'before':>11} {'after':>11} {'error':>7}", flush=True)
    with tempfile.TemporaryDirectory(prefix="advisor-bench-") as home:
        for script in chosen:
            report, error, wall = run(script, EXAMPLES[script], args.steps, args.threads, home)
            if report is None:
                print(f"{script:<14} run failed after {wall:.0f} s: {error.strip().splitlines()[-1:]}", flush=True)
                continue
            diagnosis = report.get("diagnosis") or {}
            applied = (report.get("applied") or [None])[0]
            if applied is None:
                print(f"{script:<14} {'(nothing applied)':<22} {'':<9} diagnosis: {diagnosis.get('summary')}",
                      flush=True)
                continue
            predicted = applied["predicted"]["step_time_s"]
            before = applied["measured"]["before"]["step_time_s"]
            after = applied["measured"]["after"]["step_time_s"]
            err = f"{(predicted - after) / after:+.0%}" if predicted and after else "-"
            print(f"{script:<14} {applied['remedy']:<22} {applied['status']:<9} "
                  f"{ms(predicted):>11} {ms(before):>11} "
                  f"{ms(after):>11} {err:>7}   ({wall:.0f} s; diagnosis: {diagnosis.get('bottleneck')})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
