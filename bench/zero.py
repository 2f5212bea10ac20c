"""ZeRO stages 1-3 switched live on the 2-rank DDP example: predicted against measured, per rank.

    python bench/zero.py                               # examples/ddp.py --hidden 512 --layers 4
    python bench/zero.py --script-args "--hidden 1024 --layers 6" --stages 2 3

One unswitched ``advisor attach --nproc-per-node 2`` run first. From its session, for each
stage, the memory budget under which the recommender proposes that stage (the middle of the
range of budgets that select it: it proposes the lowest stage that fits), and the predictor's
per-rank figures (``recommend/remedies/zero_model.py``, calibrated on that session). Then one
attached run per stage with that budget and ``--apply zero-K --apply-at-step K``. It prints, for
each stage and rank, the parameter, gradient and optimizer-state bytes and the peak (source: the
memory probe's ``MemorySample`` records, the highest sample after the apply; bytes), the median
light step time, and the collective time per deep step (``CollectiveStat.time_s``), beside the
predictions, and whether the ranks kept the stage.
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

from advisor.advice import advise_state  # noqa: E402
from advisor.recommend.profile import profile_from_records  # noqa: E402
from advisor.recommend.remedies.zero import measured  # noqa: E402
from advisor.recommend.remedies.zero_model import stage_cost  # noqa: E402
from advisor.records.units import format_size  # noqa: E402
from advisor.store import load_state  # noqa: E402

CATEGORIES = ("parameter", "gradient", "optimizer_state")


def attach(args: list[str], home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "advisor", "attach", "--headless", "--nproc-per-node", "2", *args]
    subprocess.run(cmd, cwd=ROOT, env={**os.environ, "ADVISOR_HOME": str(home), "OMP_NUM_THREADS": "1"},
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1200)


def state_of(home: Path):
    [db] = sorted(home.glob("sessions/*/session.sqlite"))
    return load_state(db)


def budget_selecting(state, stage: int) -> int | None:
    peak = max(m.total_bytes for m in state.memory)
    hits = [b for i in range(200) if (b := int(peak * (1 - i / 250)))
            and any(r["id"] == f"zero-{stage}" and r["fits"] for r in advise_state(state, budget_bytes=b)[1])]
    return (max(hits) + min(hits)) // 2 if hits else None


def profile_of(state, budget: int):
    ranks = sorted(state.runs)
    return profile_from_records(
        steps=[s for r in sorted(state.steps) for s in state.steps[r]], memory=state.memory, modules=state.modules,
        ops=state.ops, collectives=state.collectives, events=state.events, runs=[state.runs[r] for r in ranks],
        models=state.models, optimizers=state.optimizers, budget_bytes=budget)


def phases_text(samples) -> str:
    """Median forward, backward and optimizer seconds of light steps, in ms."""
    if not samples:
        return "-"
    keys = ("forward_s", "backward_s", "optimizer_s", "data_s", "other_s")
    return " / ".join(f"{statistics.median([s.phases.get(k, 0.0) for s in samples]) * 1e3:.1f}" for k in keys)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script-args", default="--hidden 512 --layers 4")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--at-step", type=int, default=6)
    p.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3])
    ns = p.parse_args(argv)
    script = ["examples/ddp.py", *shlex.split(ns.script_args)]
    with tempfile.TemporaryDirectory() as tmp:
        base_home = Path(tmp, "base")
        attach(["--steps", str(ns.steps), "--json", str(base_home / "r.json"), *script], base_home)
        base = state_of(base_home)
        print(f"examples/ddp.py {ns.script_args} on 2 gloo ranks; ZeRO-K applied at step {ns.at_step} "
              f"of {ns.steps}; measured = the memory probe's highest sample after the apply")
        for rank in sorted(base.steps):
            light = [s for s in base.steps[rank] if s.index > 0 and not s.deep]
            print(f"  DDP rank {rank}: step {statistics.median([s.time_s for s in light]) * 1e3:.1f} ms; phases "
                  f"forward / backward / optimizer / data / other {phases_text(light)} ms")
        for stage in ns.stages:
            budget = budget_selecting(base, stage)
            if budget is None:
                print(f"\nZeRO-{stage}: no budget makes the recommender propose it on this job")
                continue
            cost = stage_cost(measured(profile_of(base, budget)), stage)
            home = Path(tmp, f"zero{stage}")
            attach(["--steps", str(ns.steps), "--memory-budget", str(budget), "--apply", f"zero-{stage}",
                    "--apply-at-step", str(ns.at_step), "--json", str(home / "r.json"), *script], home)
            report = json.loads((home / "r.json").read_text())
            state = state_of(home)
            applied = {a["rank"]: a for a in report.get("applied") or [] if a["remedy"] == "zero"}
            print(f"\nZeRO-{stage}: budget {format_size(budget)}; predicted per rank: " + ", ".join(
                f"{c} {format_size(getattr(cost, c + '_bytes'))}" for c in CATEGORIES)
                  + f", peak {format_size(cost.peak_bytes)}, step "
                  + (f"{cost.step_time_s * 1e3:.1f} ms" if cost.step_time_s is not None else "-")
                  + (f", collectives {cost.comm_s * 1e3:.1f} ms" if cost.comm_s is not None else ""))
            for rank in sorted(state.runs):
                a = applied.get(rank)
                if a is None:
                    print(f"  rank {rank}: not applied")
                    continue
                at = a["at_step"]
                after = [m for m in state.memory if m.rank == rank and at <= m.step <= at + 3]
                if not after:
                    print(f"  rank {rank}: {a['status']}, no memory sample after the apply")
                    continue
                peak = max(after, key=lambda m: m.total_bytes)
                steps = [s for s in state.steps.get(rank, []) if s.index > at and not s.deep]
                t = statistics.median([s.time_s for s in steps]) if steps else float("nan")
                comm: dict[int, float] = {}
                for c in state.collectives:
                    if c.rank == rank and c.step > at:
                        comm[c.step] = comm.get(c.step, 0.0) + c.time_s
                cells = ", ".join(f"{c} {format_size(peak.categories.get(c, 0))}" for c in CATEGORIES)
                error = 100 * (cost.peak_bytes - peak.total_bytes) / peak.total_bytes
                print(f"  rank {rank}: {a['status']:8} measured {cells}, peak {format_size(peak.total_bytes)} "
                      f"(prediction {error:+.1f}%), step {t * 1e3:.1f} ms"
                      + (f", collectives {statistics.median(comm.values()) * 1e3:.1f} ms per deep step" if comm else "")
                      + f"; phases f/b/o/d/x {phases_text(steps)} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
