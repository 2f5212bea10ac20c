"""The joint rows of ``bench/prediction.py --suite``: joint plans applied live on 2 gloo ranks.

    python bench/joint_rows.py                   # alone: 2 budgets x up to 3 plans, 4-6 min on 2 cores

For each model of ``JOINT_SUITE`` (a 2-rank DDP job with AdamW whose model states and activations
both matter): an unconstrained ``advisor attach --headless --nproc-per-node 2`` run, then for each
budget B = f * P the joint plans the advice offers at B (one per ZeRO stage; offered only when no
single live remedy fits), each applied in its own run with ``--apply ID --apply-at-step 3``.
Printed per plan, on rank 0: kept or reverted, predicted and measured peak (the executor's window)
and step time (predicted against the median of the light steps after the apply), their errors,
and whether the losses equal the unconstrained run's (to 1e-5; FSDP2 is live-equivalent).
Targets (issue 33): |peak error| <= 5%, |step-time error| <= 10%. On CPU the stage 2/3 step-time
model leaves out FSDP2's synchronous per-unit host cost on gloo: its error is printed, not hidden.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.advice import advise_state  # noqa: E402
from advisor.store import load_state  # noqa: E402

JOINT_SUITE: list[tuple[str, list[str]]] = [  # (label, script and its arguments)
    ("ddp h256 l6 b1024, 2 ranks", ["examples/ddp.py", "--hidden", "256", "--layers", "6", "--batch", "1024"]),
]
FRACTIONS = (0.6, 0.7)
STEPS = 14
LOSS = re.compile(r"^step (\d+) loss (\S+)$")
MIB = 2**20


def _attach(home: Path, out: Path, script: list[str], *options: str) -> list[float]:
    env = {**os.environ, "ADVISOR_HOME": str(home), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "advisor", "attach", "--headless", "--nproc-per-node", "2", "--json", str(out),
           *options, *script, "--steps", str(STEPS)]
    print(f"  python -m advisor attach --headless --nproc-per-node 2 {' '.join(options)} {' '.join(script)} "
          f"--steps {STEPS}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"attach exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    return [float(m.group(2)) for line in proc.stdout.splitlines() if (m := LOSS.match(line))]


def _light_after(report: dict[str, Any], rank: int, step: int) -> float | None:
    times = [s["time_s"] for s in report.get("steps") or []
             if s.get("rank", 0) == rank and not s.get("deep") and s["index"] > step]
    return statistics.median(times) if times else None


def joint_rows(tmp: Path) -> list[tuple[str, dict[str, Any]]]:
    """Run every model of ``JOINT_SUITE``; rows in ``bench/prediction.py``'s summary form."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for k, (label, script) in enumerate(JOINT_SUITE):
        print(f"\n######## joint plans: {label}", flush=True)
        home = tmp / f"joint{k}"
        home.mkdir(parents=True)
        base = _attach(home / "base", home / "base.json", script)
        [db] = sorted((home / "base").glob("sessions/*/session.sqlite"))
        state = load_state(db)
        peak = max(m.total_bytes for m in state.memory)
        for fraction in FRACTIONS:
            budget = int(fraction * peak)
            _, recs = advise_state(state, budget_bytes=budget)
            plans = [r for r in recs if r.remedy == "joint_plan" and r.fits and r.applicable]
            print(f"\n== budget {fraction:.0%} of P = {budget} B: plans offered "
                  f"{[r.id for r in plans] or 'none'}", flush=True)
            if not plans:
                rows.append((label, {"fraction": fraction, "remedy": None}))
            for rec in plans:
                out = home / f"{rec.id}-{fraction}.json"
                losses = _attach(home / rec.id / str(fraction), out, script, "--memory-budget", str(budget),
                                 "--apply", rec.id, "--apply-at-step", "3")
                report = json.loads(out.read_text())
                [a] = [a for a in report["applied"] if a.get("rank") == 0 and a.get("recommendation_id") == rec.id]
                after = (a.get("measured") or {}).get("after") or {}
                same = len(losses) == len(base) and all(math.isclose(x, y, rel_tol=0, abs_tol=1e-5)
                                                        for x, y in zip(losses, base))
                row = {"fraction": fraction, "remedy": rec.id, "blocks": 0, "status": a.get("status"),
                       "p_peak": rec.predicted.peak_memory_bytes, "m_peak": after.get("peak_memory_bytes"),
                       "p_time": rec.predicted.step_time_s, "m_time": _light_after(report, 0, 3)}
                print(f"  {rec.id}: {a.get('status')} ({a.get('reason')}); peak predicted "
                      f"{(row['p_peak'] or 0) / MIB:.2f} MiB, measured {(row['m_peak'] or 0) / MIB:.2f} MiB; "
                      f"losses {'within 1e-5 of' if same else 'DIFFER from'} the unconstrained run's", flush=True)
                rows.append((label, row))
    return rows


def main() -> int:
    from prediction import summary

    with tempfile.TemporaryDirectory(prefix="advisor-joint-") as tmp:
        try:
            rows = joint_rows(Path(tmp))
        except RuntimeError as exc:
            print(f"bench failed: {exc}", file=sys.stderr)
            return 1
    summary(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
