"""Measured bottleneck against the advisor's diagnosis, and predicted against measured step time
with its top live remedy applied: one table row per example.

    python bench/advice.py                    # the four examples, a few minutes on 2 cores
    python bench/advice.py --steps 30 --only slow_input.py,gpt.py

For each example (``examples/cnn.py``, ``gpt.py``, ``ddp.py`` on 2 ranks, ``slow_input.py``), two
runs of ``python -m advisor attach --headless --allow-inexact --steps S --json R``:

1. *Unchanged.* The report's final diagnosis and its top recommendation, and the measured
   bottleneck, which reads no rule: the largest of the step's measured costs on rank 0, from
   the phase split of every step (``summary.phase_share``) with the exposed collective share
   (``comm[rank 0].exposed_share``, on the deep steps where collectives are timed) taken out of
   backward: ``input`` (data wait), ``compute`` (forward and backward less exposed collectives:
   ops and their host gaps together), ``optimizer`` (the optimizer step), ``communication``
   (exposed collectives).
2. *Applied.* ``--apply ID --apply-at-step K`` with ID the top *live* recommendation of run 1 (any
   apply class: ``--allow-inexact``). The row gives its status (kept or reverted by the
   executor), the predicted step time, the measured step time before and after the apply (the
   executor's windows on rank 0: ``report["applied"][0]["measured"]``, light steps against light
   steps: K is past the default deep steps 1-3), and the error ``(predicted - after) / after``.
   With ``--repeat N`` the applied run is repeated and the medians are printed, with every
   run's status.

Every process runs with ``OMP_NUM_THREADS=1`` (``--threads``; bench/overhead.py: on a shared
2-core machine two OpenMP threads make step times swing) and ``ADVISOR_HOME`` in a temporary
folder, so nothing is written to the user's sessions. Figures: docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES: dict[str, list[str]] = {  # script -> extra attach options
    "cnn.py": [],
    "gpt.py": [],
    "ddp.py": ["--nproc-per-node", "2"],
    "slow_input.py": [],
}
APPLY_AT = 8  # past the default deep steps (1-3) and a light before-window (4-7)


def attach(script: str, extra: list[str], steps: int, threads: int, home: str, tag: str) -> tuple[dict | None, str]:
    out = Path(home) / f"{script}.{tag}.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "ADVISOR_HOME": home}
    cmd = [sys.executable, "-m", "advisor", "attach", "--headless", "--allow-inexact", "--steps", str(steps),
           *extra, "--json", str(out), f"examples/{script}", "--steps", str(steps)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=1200)
    if not out.exists():
        return None, (done.stderr.strip().splitlines() or ["no report"])[-1]
    return json.loads(out.read_text()), ""


def measured_bottleneck(report: dict[str, Any]) -> tuple[str, float]:
    """The largest measured cost of rank 0's step and its share (see the module docstring)."""
    share = (report.get("summary") or {}).get("phase_share") or {}
    comm = next((c for c in report.get("comm") or [] if c.get("rank") == 0), {})
    exposed = min(float(comm.get("exposed_share") or 0.0), float(share.get("backward_s") or 0.0))
    costs = {
        "input": float(share.get("data_s") or 0.0),
        "compute": float(share.get("forward_s") or 0.0) + float(share.get("backward_s") or 0.0) - exposed,
        "optimizer": float(share.get("optimizer_s") or 0.0),
        "communication": exposed,
    }
    name = max(costs, key=costs.__getitem__)
    return name, costs[name]


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def row(script: str, extra: list[str], args: argparse.Namespace, home: str) -> list[str]:
    plain, error = attach(script, extra, args.steps, args.threads, home, "plain")
    if plain is None:
        return [script, f"run failed: {error}"]
    measured, share = measured_bottleneck(plain)
    diagnosis = (plain.get("diagnosis") or {}).get("bottleneck") or "none"
    recs = plain.get("recommendations") or []
    top = recs[0]["id"] if recs else "-"
    live = next((r for r in recs if r.get("live")), None)
    cells = [script, f"{measured} {share:.0%}", diagnosis, top]
    if live is None:
        return cells + ["(no live remedy)", "", "", "", "", ""]
    runs = []
    for i in range(args.repeat):
        applied_run, error = attach(script, [*extra, "--apply", live["id"], "--apply-at-step", str(APPLY_AT)],
                                    args.steps, args.threads, home, f"applied{i}")
        applied = next((a for a in (applied_run or {}).get("applied") or [] if a.get("rank", 0) == 0), None)
        if applied is not None:
            runs.append(applied)
    if not runs:  # the run failed, or its advice at the apply step no longer named the remedy
        return cells + [live["id"], "not applied", "", "", "", error or f"not recommended by step {APPLY_AT}"]
    predicted = _median([a["predicted"]["step_time_s"] for a in runs])
    before = _median([a["measured"]["before"]["step_time_s"] for a in runs])
    after = _median([a["measured"]["after"]["step_time_s"] for a in runs])
    err = f"{(predicted - after) / after:+.0%}" if predicted and after else "-"
    kinds = "/".join(sorted({a["measured"]["after"].get("step_kind") or "-" for a in runs}))
    statuses = "/".join(a["status"] for a in runs)
    return cells + [live["id"], statuses, ms(predicted), ms(before), f"{ms(after)} ({kinds})", err]


def _median(values: list[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return statistics.median(known) if known else None


HEADER = ["example", "measured", "diagnosis", "top rec.", "applied", "status", "pred. ms", "before ms",
          "after ms", "error"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", default="", help="comma-separated example file names")
    p.add_argument("--repeat", type=int, default=1, help="applied runs per example (medians are printed)")
    args = p.parse_args(argv)
    if args.steps < APPLY_AT + 10:
        p.error(f"--steps must be at least {APPLY_AT + 10}: the apply at step {APPLY_AT} needs its window")
    chosen = [s for s in EXAMPLES if not args.only or s in args.only.split(",")]
    print("| " + " | ".join(HEADER) + " |", flush=True)
    print("|" + "---|" * len(HEADER), flush=True)
    with tempfile.TemporaryDirectory(prefix="advisor-bench-") as home:
        for script in chosen:
            print("| " + " | ".join(row(script, EXAMPLES[script], args, home)) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
