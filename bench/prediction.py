"""Predicted against measured: checkpointing applied live under a memory budget.

    python bench/prediction.py                  # 5 runs of examples/gpt.py, 2-5 min on 2 cores
    python bench/prediction.py --budgets 0.4,0.6,0.8,0.95 --steps 40 --script-args "--layers 8"
    python bench/prediction.py --suite          # the models nobody tuned (issue 14), 20-40 min
    python bench/prediction.py --script examples/cnn.py --script-args "--width 16"

``--suite`` runs, one after the other, examples/gpt.py at three sizes, examples/cnn.py, an MLP
of equal blocks and a chain of blocks that differ in size (bench/models/chain.py), then the joint
plans of a ZeRO stage and checkpointing on a 2-rank DDP job (bench/joint_rows.py), and ends with
one table: per model and budget, the plan kept, predicted and measured peak and step time (light steps:
the executor's window when it timed light steps, else the light steps after it), and
the errors (target |peak error| <= 5%, |step-time error| <= 10% on every kept plan).

1. ``python examples/gpt.py --steps S`` bare: the reference losses.
2. ``python -m advisor attach --headless --steps 6 --probes memory --json R0 examples/gpt.py``:
   the unconstrained peak P (``memory.peak_bytes``) and the profile the offline solver reads.
3. For each budget B = f * P (f in ``--budgets``, default 0.5, 0.7, 0.9):
   ``python -m advisor attach --headless --probes memory --memory-budget B --apply auto
   --apply-at-step 15 --steps S --json R examples/gpt.py --steps S`` (S = ``--steps``, default 45;
   the script gets it too, its own default being 30). The recommendation is the advice made
   with step 13 (the last the job sends before it holds for the decision), so it reads the
   ordinary steps after the deep steps 1-3 up to there: steps 4 and 9 time the blocks' forward
   (the recompute cost, their median), and the median of them all is the baseline step time. Applied at step 6 it read step 4 alone, and one step on this machine swings by
   10-20%: a slow step 4 doubled the predicted recompute of a GPT once.

Printed per budget: the remedy applied (``report["applied"][0]``: modules, status,
predicted and measured peak, the relative error (predicted - measured) / measured,
whether the measured peak fits B; predicted step time and the measured before / after step
times (the executor times the light steps at the end of its window, the peak comes from
its deep steps), plus the median of the light steps after the window; the table's measured
step time is the median of every light step after the apply, the window's and those after
it), and, offline on R0's
profile, the recompute overhead of the solver's plan (``solve_checkpointing``)
against Chen's sqrt(n) heuristic (``chen_sqrt_n``) at the same budget (and the
solver at 90% of it, the headroom the live advisor plans against first, so the
live choice can differ from the plan at B). Then
whether the S losses equal the bare run's exactly (checkpointing must not change
numerics): the losses in the report's steps, and the script's printed lines.
A budget that cannot be met (nothing applied) is printed as such, with what the diagnosis
says would help.

Every process runs with ``OMP_NUM_THREADS=1`` (``--threads``; see bench/overhead.py: on a
shared 2-core machine two OpenMP threads make step times swing 40x).

Each run gets ``ADVISOR_HOME`` in a temporary folder, so nothing is written to
the user's sessions. Peaks are the memory probe's tracked bytes (CPU: no allocator).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.advice import profile_of_state  # noqa: E402
from advisor.paths import DB_NAME  # noqa: E402
from advisor.recommend.memory_model import chain_from_profile  # noqa: E402
from advisor.recommend.remedies.checkpoint_solver import Plan, chen_sqrt_n, solve_checkpointing  # noqa: E402
from advisor.recommend.rules.memory import MEMORY_PRESSURE  # noqa: E402
from advisor.store import load_state  # noqa: E402

SCRIPT = ROOT / "examples" / "gpt.py"
SUITE: list[tuple[str, str, str]] = [  # (label, script, its arguments)
    ("gpt", "examples/gpt.py", ""),
    ("gpt h256", "examples/gpt.py", "--hidden 256 --heads 8"),
    ("gpt h256 s128 l6", "examples/gpt.py", "--hidden 256 --heads 8 --seq 128 --layers 6"),
    ("cnn", "examples/cnn.py", ""),
    ("mlp", "bench/models/chain.py", "--widths 256,256,256,256,256,256"),
    ("hetero chain", "bench/models/chain.py", "--widths 128,512,1024,256,768,64"),
]
STEP_LINE = re.compile(r"^step (\d+) loss (\S+)\s*$")
MIB = 2**20


UNAPPLIED = "never happened"  # attach --headless --apply exits 1 when nothing was applied


def run(cmd: list[str], env: dict[str, str], *, unapplied_ok: bool = False) -> list[str]:
    """Run to completion; the script's step lines. Raises RuntimeError with stderr's tail on failure.

    ``unapplied_ok``: a budgeted run whose ``--apply auto`` found nothing to apply (attach exits 1
    and says so) is a row of the table ("nothing applied"), not a failure of the bench."""
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    unapplied = unapplied_ok and proc.returncode == 1 and UNAPPLIED in proc.stderr[-2000:]
    if proc.returncode != 0 and not unapplied:
        raise RuntimeError(f"{display(cmd)} exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    return [line for line in proc.stdout.splitlines() if STEP_LINE.match(line)]


def display(cmd: list[str]) -> str:
    """The command as a user would type it from the repository root."""
    return shlex.join(["python", *(os.path.relpath(a, ROOT) if a.startswith(str(ROOT)) else a for a in cmd[1:])])


def attach(options: list[str], report: Path, script: Path, script_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "advisor", "attach", "--headless", *options, "--json", str(report),
            str(script), *script_args]


def mib(value: float | None) -> str:
    return "?" if value is None else f"{value / MIB:.2f} MiB"


def ms(value: float | None) -> str:
    return "?" if value is None else f"{value * 1e3:.1f} ms"


def plan_line(label: str, plan: Plan | None) -> str:
    if plan is None:
        return f"    {label:7s} nothing to checkpoint"
    fits = "fits" if plan.feasible else "DOES NOT FIT"
    return (f"    {label:7s} {len(plan.modules)} modules {list(plan.modules)}; predicted peak {mib(plan.peak_bytes)} "
            f"({fits}); recompute +{ms(plan.overhead_s)}/step")


def offline(report0: dict[str, Any], budget: int) -> None:
    """Solver against Chen's sqrt(n), both on the unconstrained run's profile (its session's
    records, as the advisor reads them)."""
    profile = profile_of_state(load_state(Path(report0["session"]["path"]) / DB_NAME), budget_bytes=budget)
    if profile is None:
        print("  offline: the unconstrained run measured nothing")
        return
    solver = solve_checkpointing(profile, budget)
    chain = chain_from_profile(profile)
    chen = chen_sqrt_n(chain, budget) if chain is not None else None
    print("  offline, on the unconstrained run's profile:")
    print(plan_line("solver", solver))
    # The live advisor plans against MEMORY_PRESSURE * budget first (headroom), then the budget.
    target = int(MEMORY_PRESSURE * budget)
    headroom = solve_checkpointing(profile, target)
    if headroom is not None and headroom.feasible:
        print(plan_line(f"@{MEMORY_PRESSURE:.0%}", headroom) + "  (the advisor's headroom target)")
    print(plan_line("chen", chen))
    if solver is not None and chen is not None:
        if solver.feasible and chen.feasible:
            ratio = solver.overhead_s / chen.overhead_s if chen.overhead_s > 0 else float("nan")
            print(f"    recompute overhead solver / chen = {ratio:.2f}")
        elif solver.feasible:
            print("    chen's sqrt(n) plan does not fit this budget; the solver's does")
        else:
            print("    neither fits this budget under the memory model")
        # The comparison bench/solver.py makes: the solver given the peak Chen's plan reaches.
        at_chen = solve_checkpointing(profile, chen.peak_bytes)
        if at_chen is not None and at_chen.feasible and chen.overhead_s > 0:
            print(f"    at chen's own peak {mib(chen.peak_bytes)}: solver +{ms(at_chen.overhead_s)} "
                  f"({len(at_chen.modules)} modules) vs chen +{ms(chen.overhead_s)}: "
                  f"ratio {at_chen.overhead_s / chen.overhead_s:.2f}")


def live(report: dict[str, Any], budget: int) -> dict[str, Any] | None:
    """Print the applied remedy's predicted vs measured figures; the row for the summary table,
    None when nothing was applied."""
    applied = report.get("applied") or []
    recs = report.get("recommendations") or []
    if not applied:
        print("  live: NOTHING APPLIED: the budget cannot be met by a remedy the advisor can apply")
        for r in recs:
            print(f"    recommendation {r.get('id')}: {r.get('remedy')} - {r.get('title')} "
                  f"(fits={r.get('fits')}, predicted peak {mib((r.get('predicted') or {}).get('peak_memory_bytes'))})")
        for item in (report.get("diagnosis") or {}).get("evidence") or []:
            if item.get("what") in ("no remedy fits the budget", "would help"):
                print(f"    {item['what']}: {item.get('value')}")
        return None
    a = applied[0]
    predicted, measured = a.get("predicted") or {}, a.get("measured") or {}
    before, after = measured.get("before") or {}, measured.get("after") or {}
    p_peak, m_peak = predicted.get("peak_memory_bytes"), after.get("peak_memory_bytes")
    print(f"  live: {a.get('remedy')} {a.get('params', {}).get('modules')} at step {a.get('at_step')}: "
          f"{a.get('status')} ({a.get('reason') or a.get('error')})")
    err = f"{(p_peak - m_peak) / m_peak:+.1%}" if p_peak is not None and m_peak else "?"
    fits = "?" if m_peak is None else ("yes" if m_peak <= budget else "NO")
    print(f"    peak      before {mib(before.get('peak_memory_bytes'))}  predicted {mib(p_peak)}  "
          f"measured {mib(m_peak)}  error {err}  measured <= budget: {fits}")
    window = set(after.get("steps") or [])
    steps = report.get("steps") or []
    later = [_time(s) for s in steps if not s.get("deep") and s["index"] > max(window, default=1 << 30)]
    timed = set(after.get("time_steps") or [])
    window_light = [_time(s) for s in steps if not s.get("deep") and s["index"] in timed]
    after_deep = all(s.get("deep") for s in steps if s["index"] in window)
    print(f"    step time before {ms(before.get('step_time_s'))} (steps {before.get('steps')})  "
          f"predicted {ms(predicted.get('step_time_s'))}  after {ms(after.get('step_time_s'))} "
          f"(steps {sorted(window)}{', all deep-sampled' if after_deep and window else ''})  "
          f"light steps after the window {ms(statistics.median(later)) if later else '?'} ({len(later)} steps)")
    # The prediction is for an ordinary (light) step: compare it with light steps only. A window
    # timed on deep steps (probes on, 2-6x slower) is replaced by the light steps after it.
    p_time = predicted.get("step_time_s")
    if after.get("step_kind") == "light":
        # Every light step after the apply: the window's and the ones after it (single steps on
        # this machine swing by 10-20%; the prediction is of the steady step).
        m_time = statistics.median(window_light + later)
    else:
        m_time = statistics.median(later) if later else None
        print(f"    step time compared with the light steps after the window ({ms(m_time) if m_time else '?'}): "
              f"the window was timed on {after.get('step_kind') or 'no'} steps")
    return {"remedy": a.get("remedy"), "blocks": len((a.get("params") or {}).get("modules") or []),
            "status": a.get("status"), "p_peak": p_peak, "m_peak": m_peak, "p_time": p_time, "m_time": m_time,
            "before_time": before.get("step_time_s")}


def _time(step: dict[str, Any]) -> float:
    """A step's time as the profile's baseline reads it: on the device's timeline where there is one."""
    return step["device_time_s"] if step.get("device_time_s") is not None else step["time_s"]


def losses(report: dict[str, Any], printed: list[str], bare: list[str]) -> None:
    bare_values = [float(STEP_LINE.match(line).group(2)) for line in bare]  # type: ignore[union-attr]
    recorded = [s.get("loss") for s in sorted(report.get("steps") or [], key=lambda s: s["index"])]
    same = sum(1 for x, y in zip(recorded, bare_values) if x == y)
    lines_same = sum(1 for x, y in zip(printed, bare) if x == y)
    ok = same == len(bare_values) == len(recorded) and lines_same == len(printed)
    print(f"  losses {'IDENTICAL' if ok else 'DIFFER'} to the bare run: report {same}/{len(bare_values)} equal "
          f"({len(recorded)} recorded); printed lines {lines_same}/{len(printed)} identical")
    if not ok and ((report.get("run") or {}).get("device") or {}).get("type") == "cuda":
        print("    (on CUDA the default kernels are not reproducible run to run: two unmodified backward passes "
              "differ; under torch.use_deterministic_algorithms checkpointing changes no bit, "
              "tests/test_checkpoint_gpu.py)")
    if len(printed) < len(bare):
        print(f"    OUTPUT DIFFERS: the script printed {len(printed)} step lines under the advisor, {len(bare)} bare "
              f"(--steps stopped it before its last print)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budgets", default="0.5,0.7,0.9", help="fractions of the unconstrained peak (default 0.5,0.7,0.9)")
    p.add_argument("--steps", type=int, default=45, help="steps of each budgeted run (default 45)")
    p.add_argument("--apply-at-step", type=int, default=15, help="step boundary to apply at (default 15)")
    p.add_argument("--profile-steps", type=int, default=6, help="steps of the unconstrained run (default 6)")
    p.add_argument("--threads", type=int, default=1,
                   help="OMP_NUM_THREADS for every run (default 1; 0 leaves the environment as it is)")
    p.add_argument("--script", default="examples/gpt.py", help="the training script, relative to the repository")
    p.add_argument("--script-args", default="", help='extra arguments for the script, e.g. "--layers 8"')
    p.add_argument("--suite", action="store_true", help="run every model of SUITE and print one table")
    args = p.parse_args(argv)
    try:
        args.fractions = [float(x) for x in args.budgets.split(",") if x.strip()]
    except ValueError:
        p.error(f"--budgets takes comma-separated fractions, got {args.budgets!r}")
    if not args.fractions or any(not 0 < f for f in args.fractions):
        p.error("--budgets needs positive fractions")
    if args.steps <= args.apply_at_step + 8:
        p.error("--steps must leave at least 9 steps after --apply-at-step (the measuring window is 7)")
    return args


def run_model(args: argparse.Namespace, script: Path, extra: list[str], tmp: Path,
              env: dict[str, str]) -> list[dict[str, Any]]:
    """The unconstrained run, then one budgeted run per fraction; the summary rows."""
    # The script gets --steps too, so a run longer than its own default (30) is not cut short.
    script_args = ["--steps", str(args.steps), *extra]
    bare_cmd = [sys.executable, str(script), *script_args]
    print(f"bare:          {display(bare_cmd)}", flush=True)
    bare = run(bare_cmd, env)
    r0 = tmp / "unconstrained.json"
    cmd = attach(["--steps", str(args.profile_steps), "--probes", "memory"], r0, script, extra)
    print(f"unconstrained: {display(cmd)}", flush=True)
    run(cmd, env)
    report0 = json.loads(r0.read_text())
    peak = int(report0["memory"]["peak_bytes"])
    print(f"unconstrained peak P = {peak} B ({mib(peak)}), at step {report0['memory'].get('peak_step')}")
    rows = []
    for fraction in args.fractions:
        budget = int(fraction * peak)
        path = tmp / f"budget-{fraction}.json"
        cmd = attach(["--probes", "memory", "--memory-budget", str(budget), "--apply", "auto",
                      "--apply-at-step", str(args.apply_at_step), "--steps", str(args.steps)],
                     path, script, script_args)
        print(f"\n== budget {fraction:.0%} of P = {budget} B ({mib(budget)})", flush=True)
        print(f"  {display(cmd)}", flush=True)
        offline(report0, budget)
        printed = run(cmd, env, unapplied_ok=True)
        report = json.loads(path.read_text())
        row = live(report, budget)
        rows.append({"fraction": fraction, **(row or {"remedy": None})})
        losses(report, printed, bare)
    return rows


def _err(pred: float | None, meas: float | None) -> str:
    return f"{(pred - meas) / meas:+.1%}" if pred is not None and meas else "-"


def summary(table: list[tuple[str, dict[str, Any]]]) -> None:
    print("\n| model | budget | plan | peak predicted / measured | error | step predicted / measured | error |")
    print("|---|---|---|---|---|---|---|")
    for label, r in table:
        if not r.get("remedy"):
            print(f"| {label} | {r['fraction']:.0%} | nothing applied | - | - | - | - |")
            continue
        plan = f"{r['blocks']} blocks" if r["remedy"] == "activation_checkpointing" else r["remedy"]  # a joint plan: its id
        print(f"| {label} | {r['fraction']:.0%} | {plan}, {r['status']} | "
              f"{mib(r['p_peak'])} / {mib(r['m_peak'])} | {_err(r['p_peak'], r['m_peak'])} | "
              f"{ms(r['p_time'])} / {ms(r['m_time'])} | {_err(r['p_time'], r['m_time'])} |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = SUITE if args.suite else [(Path(args.script).stem, args.script, args.script_args)]
    table: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="advisor-bench-") as tmp:
        env = {**os.environ, "ADVISOR_HOME": str(Path(tmp) / "home"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        for k, (label, script, script_args) in enumerate(models):
            print(f"\n######## {label}: {script} {script_args}", flush=True)
            folder = Path(tmp) / f"model{k}"
            folder.mkdir()
            try:
                rows = run_model(args, ROOT / script, shlex.split(script_args), folder, env)
            except RuntimeError as exc:
                print(f"bench failed on {label}: {exc}", file=sys.stderr)
                return 1
            table += [(label, row) for row in rows]
        if args.suite:  # joint plans on 2 ranks: a ZeRO stage and checkpointing together (issue 33)
            from joint_rows import joint_rows

            try:
                table += joint_rows(Path(tmp))
            except RuntimeError as exc:
                print(f"bench failed on the joint plans: {exc}", file=sys.stderr)
                return 1
    summary(table)
    print(f"\n{sum(1 for _, r in table if r.get('remedy'))}/{len(table)} budgets got a remedy applied")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
