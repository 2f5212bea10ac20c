"""ZeRO-1 switched live on the 2-rank DDP example: predicted against measured, per rank.

    python bench/zero.py                               # examples/ddp.py --hidden 512 --layers 4
    python bench/zero.py --script-args "--hidden 1024 --layers 6" --budget 0.8

One ``advisor attach --nproc-per-node 2`` run with a memory budget at ``--budget`` of the
unremedied peak and ``--apply zero-1 --apply-at-step K``. From the recorded session it prints,
for each rank, the memory by category at the peak of the deep steps before the apply and after
it (source: the memory probe's ``MemorySample`` records, bytes), the median light step time
before and after, and the collective time per step (``CollectiveStat``), beside the
recommendation's predictions. Stages 2 and 3 are not built, so they are not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.store import load_state  # noqa: E402
from advisor.records.units import format_size  # noqa: E402

CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "temporary", "other")


def attach(args: list[str], home: str) -> None:
    cmd = [sys.executable, "-m", "advisor", "attach", "--headless", "--nproc-per-node", "2", *args]
    subprocess.run(cmd, cwd=ROOT, env={**os.environ, "ADVISOR_HOME": home}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1200)


def peak_categories(samples) -> tuple[int, dict[str, int]]:
    peak = max(samples, key=lambda s: s.total_bytes)
    return peak.total_bytes, dict(peak.categories)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script-args", default="--hidden 512 --layers 4")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--at-step", type=int, default=8)
    p.add_argument("--budget", type=float, default=0.9, help="budget as a share of the unremedied peak")
    ns = p.parse_args(argv)
    script = ["examples/ddp.py", *shlex.split(ns.script_args)]
    with tempfile.TemporaryDirectory() as home:
        report = Path(home) / "base.json"
        attach(["--steps", "8", "--json", str(report), *script], home)
        base_peak = json.loads(report.read_text())["memory"]["peak_bytes"]
        budget = int(base_peak * ns.budget)
        report = Path(home) / "zero.json"
        attach(["--steps", str(ns.steps), "--memory-budget", str(budget), "--apply", "zero-1",
                "--apply-at-step", str(ns.at_step), "--json", str(report), *script], home)
        data = json.loads(report.read_text())
        db = sorted(Path(home, "sessions").glob("*/session.sqlite"))[-1]
        state = load_state(db)
    applied = {a["rank"]: a for a in data.get("applied") or []}
    if not applied:
        print("ZeRO-1 was not applied; recommendations:", [r["id"] for r in data.get("recommendations", [])])
        return 1
    at = min(a["at_step"] for a in applied.values())
    print(f"examples/ddp.py {ns.script_args} on 2 gloo ranks; budget {format_size(budget)} "
          f"({ns.budget:.0%} of the unremedied peak {format_size(base_peak)}); ZeRO-1 at step {at}")
    for rank in sorted(state.runs):
        a = applied.get(rank, {})
        before = [m for m in state.memory if m.rank == rank and m.step < at]
        after = [m for m in state.memory if m.rank == rank and m.step > at]
        steps = state.steps.get(rank, [])
        t_before = statistics.median([s.time_s for s in steps if 0 < s.index < at and not s.deep] or [float("nan")])
        t_after = statistics.median([s.time_s for s in steps if s.index > at + 4 and not s.deep] or [float("nan")])
        comm = {}
        for c in state.collectives:
            if c.rank == rank:
                key = "after" if c.step > at else "before"
                comm.setdefault(key, {}).setdefault(c.step, 0.0)
                comm[key][c.step] += c.time_s
        predicted = a.get("predicted") or {}
        print(f"\nrank {rank}: {a.get('status', '?')} ({a.get('reason', '')})")
        if before and after:
            pb, cb = peak_categories(before)
            pa, ca = peak_categories(after)
            pp = predicted.get("peak_memory_bytes")
            print(f"  peak       before {format_size(pb):>11}  after {format_size(pa):>11}  predicted "
                  f"{format_size(pp):>11}  error {100 * (pp - pa) / pa:+.1f}%" if pp else "")
            for cat in CATEGORIES:
                print(f"    {cat:16} {format_size(cb.get(cat, 0)):>11}        {format_size(ca.get(cat, 0)):>11}")
        pt = predicted.get("step_time_s")
        print(f"  step time  before {t_before * 1e3:8.1f} ms  after {t_after * 1e3:8.1f} ms  predicted "
              + (f"{pt * 1e3:8.1f} ms  error {100 * (pt - t_after) / t_after:+.1f}%" if pt else "-"))
        for key in ("before", "after"):
            per_step = list(comm.get(key, {}).values())
            if per_step:
                print(f"  collectives {key:6} {statistics.median(per_step) * 1e3:8.1f} ms per deep step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
