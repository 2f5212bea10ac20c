"""The advisor's step-time overhead on an unmodified script, measured side by side.

    python bench/overhead.py                    # 3 repetitions x 40 steps, 2-5 min on 2 cores
    python bench/overhead.py --reps 5 --steps 200 --script-args "--layers 8 --hidden 256"
    python bench/overhead.py --threads 0        # torch's own thread count (noisy on a shared machine)
    python bench/overhead.py --inproc [ARGS]    # the in-process mode: bench/overhead_inproc.py ARGS
    python bench/overhead.py --script bench/models/chain.py --script-args "--dim 256 --widths 1024,1024,1024,1024" \
        --reps 8 --steps 60                     # a plain MLP (issue 37's 20 ms step)
    python bench/overhead.py --split ...        # also the agent without its controller process

Runs ``python examples/gpt.py --steps N`` bare and under
``python -m advisor attach --headless --steps N --json R examples/gpt.py --steps N``
(the script gets ``--steps N`` too: its own default is 30), once with the agent's
probes (``--probes``, default the advisor's default, ``all``) and once with
``--probes none`` (the agent's own hooks and channel, no probe), alternating the
three configurations within each repetition and rotating their order between
repetitions so drift and background load hit all of them alike.

Step time is measured outside the process and identically for every
configuration: the parent time-stamps each ``step i loss x`` line with
``time.perf_counter()`` as it arrives on the pipe (the script flushes it right
after the optimizer step), and step i's time is stamp(i) - stamp(i-1). Excluded
from every series alike: the first ``--warmup`` steps, each deep-sampled step of
any advisor run (the JSON report's ``deep: true``), the step right after each
(probe teardown), and the step before each (the deep probes start at the
boundary that precedes that step's line). Only indices printed by every run are
compared (an agent that ends the script inside the N-th ``optimizer.step()``
leaves the N-th line unprinted).

Printed: per configuration, the median steady-state step time of each
repetition and overall; per advisor configuration, the ratio advisor / bare of
the medians within each repetition (median and min..max over repetitions), a
95% bootstrap interval of that median (each resample draws the repetitions, and
within each drawn one both runs' steps, with replacement: the noise between and
within runs) and the pooled ratio; then the same ratio on the steps each advisor run block-timed (its report's
``steps[].module_forward_s``: the light block timing, a few steps early in a run and
fewer as it grows) and on the rest. Target for light probes: <= 1.03 with the
interval's upper end below 1.05 (issue 37).

Every process runs with ``OMP_NUM_THREADS=1`` by default (``--threads``): OpenMP
workers spin at barriers, so with other processes on a 2-core machine a
2-thread step was seen to take 40x longer for tens of seconds, which no
alternation can compensate. One thread makes the bare step slower (about 65
against 50 ms here), so the relative overhead reads somewhat lower than with
torch's default threads.

Each run gets ``ADVISOR_HOME`` in a temporary folder, so nothing is written to
the user's sessions.
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
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # --split imports the advisor: also from a checkout that is not installed
    sys.path.append(str(ROOT))
SCRIPT = ROOT / "examples" / "gpt.py"  # the default --script
BOOTSTRAP_RESAMPLES = 2000
STEP_LINE = re.compile(rb"^step (\d+) loss (\S+)\s*$")
TARGET = 1.03


@dataclass
class Run:
    """One process: the arrival time of each step line, and the advisor's deep steps."""

    config: str
    rep: int
    stamps: dict[int, float] = field(default_factory=dict)
    deep: set[int] = field(default_factory=set)
    timed: set[int] = field(default_factory=set)  # light steps that timed their blocks (module_forward_s)
    wall_s: float = 0.0
    load: float = 0.0  # 1-minute load average when the run started (os.getloadavg)

    def intervals(self) -> dict[int, float]:
        """Step i's time: from step i-1's line to step i's line, seconds (parent's perf_counter)."""
        return {i: t - self.stamps[i - 1] for i, t in self.stamps.items() if i - 1 in self.stamps}


def timed_run(cmd: list[str], env: dict[str, str], config: str, rep: int) -> Run:
    """Run ``cmd``, stamping each step line as it arrives; raises with stderr's tail on failure."""
    run = Run(config=config, rep=rep, load=os.getloadavg()[0])
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        # A BufferedReader's readline returns as soon as a newline has arrived on the pipe.
        for line in iter(proc.stdout.readline, b""):
            now = time.perf_counter()
            match = STEP_LINE.match(line)
            if match:
                run.stamps[int(match.group(1))] = now
        code = proc.wait()
        run.wall_s = time.perf_counter() - start
        if code != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{shlex.join(cmd)} exited with {code}:\n{tail}")
    return run


ALONE = "agent, no controller"  # the --split configuration's label


def configurations(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(label, command without --json) for bare, advisor with --probes, advisor with --probes none,
    and with ``--split`` the training process's agent alone (``alone_env``)."""
    script = [str(args.script), "--steps", str(args.steps), *shlex.split(args.script_args)]
    attach = [sys.executable, "-m", "advisor", "attach", "--headless", "--steps", str(args.steps)]
    probes = args.probes or "all"
    extra = ["--probes", args.probes] if args.probes else []
    out = [("bare", [sys.executable, *script]),
           (f"advisor --probes {probes}", [*attach, *extra, *script])]
    if probes != "none":
        out.append(("advisor --probes none", [*attach, "--probes", "none", *script]))
    if args.split:
        from advisor.launch import BOOTSTRAP, python_command

        out.append((ALONE, python_command(BOOTSTRAP, script)))
    return out


def alone_env(args: argparse.Namespace, session_dir: Path) -> dict[str, str]:
    """What the controller gives a training process (its settings: --probes, --steps), less the
    controller's socket: the agent runs and spills its records to ``session_dir``, and no
    controller process shares the machine. Against attach, this splits what the training process
    pays from what a second process on the cores costs it."""
    from advisor.records.settings import AgentSettings, encode_settings, probe_names

    settings = AgentSettings(probes=tuple(probe_names(args.probes)), max_steps=args.steps)
    session_dir.mkdir(mode=0o700)
    return {"ADVISOR_CONFIG": encode_settings(settings), "ADVISOR_SESSION_DIR": str(session_dir),
            "PYTHONUNBUFFERED": "1", "KINETO_LOG_LEVEL": "6"}


def with_json(cmd: list[str], path: Path, script: Path) -> list[str]:
    """Insert ``--json path`` among the advisor's options (before the script)."""
    i = cmd.index(str(script))
    return [*cmd[:i], "--json", str(path), *cmd[i:]]


def display(cmd: list[str], script: Path) -> str:
    """The command as a user would type it from the repository root."""
    return shlex.join(["python", *(os.path.relpath(a, ROOT) if a == str(script) else a for a in cmd[1:])])


def bootstrap_interval(series: dict[tuple[str, int], list[float]], label: str, reps: range,
                       seed: int = 0) -> tuple[float, float]:
    """95% interval of the median over repetitions of advisor / bare medians: each resample draws
    the repetitions, and within each drawn one both runs' steps, with replacement."""
    import numpy as np

    rng = np.random.default_rng(seed)
    runs = [(np.asarray(series[(label, r)]), np.asarray(series[("bare", r)])) for r in reps]
    stats = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        ratios = []
        for k in rng.integers(0, len(runs), len(runs)):
            advised, bare = runs[k]
            ratios.append(np.median(rng.choice(advised, advised.size)) / np.median(rng.choice(bare, bare.size)))
        stats.append(np.median(ratios))
    low_end, high_end = np.percentile(stats, [2.5, 97.5])
    return float(low_end), float(high_end)


def report_steps(report_path: Path) -> tuple[set[int], set[int]]:
    """(the deep steps, the light steps that timed their numbered modules' forward: a non-empty
    ``module_forward_s``) of an advisor run's report."""
    steps = json.loads(report_path.read_text()).get("steps") or []
    return ({int(s["index"]) for s in steps if s.get("deep")},
            {int(s["index"]) for s in steps if s.get("module_forward_s") and not s.get("deep")})


def split_by_timing(runs: list[Run], kept: list[int], labels: list[str], reps: range) -> None:
    """The ratio to bare on the steps an advisor run block-timed and on the rest, from each run's
    report: what the light block timing costs where it runs, and what every other step pays."""
    timed = set().union(*(r.timed for r in runs))
    if not timed:
        return
    print()
    print(f"{'by step (median ratio)':24s} {'block-timed':>12s} {'other':>8s}   ({len(timed & set(kept))} "
          f"of {len(kept)} compared steps block-timed in some run)")
    by_run = {(r.config, r.rep): (r, r.intervals()) for r in runs}
    for label in labels[1:]:
        cells = []
        for pick in (lambda i, run: i in run.timed, lambda i, run: i not in run.timed):
            ratios = []
            for rep in reps:
                (run, times), (_, bare) = by_run[(label, rep)], by_run[("bare", rep)]
                own = [i for i in kept if pick(i, run)]
                if own:
                    ratios.append(statistics.median(times[i] for i in own) / statistics.median(bare[i] for i in own))
            cells.append(f"{statistics.median(ratios):.3f}" if ratios else "-")
        print(f"{label:24s} {cells[0]:>12s} {cells[1]:>8s}")


def low(series: list[float]) -> float:
    """20th percentile: the step time with less of other processes' interference in it."""
    if len(series) < 2:
        return series[0]
    return statistics.quantiles(series, n=5, method="inclusive")[0]


def measure(args: argparse.Namespace) -> list[Run]:
    configs = configurations(args)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="advisor-bench-") as tmp:
        env = {**os.environ, "ADVISOR_HOME": str(Path(tmp) / "home"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        if args.threads:
            # OpenMP workers spin at barriers: with other processes on the cores, a 2-thread step
            # can take 40x longer. One thread per process keeps the series comparable under load.
            env["OMP_NUM_THREADS"] = str(args.threads)
        for rep in range(args.reps):
            shift = rep % len(configs)  # rotate the order so no configuration always runs first
            for label, cmd in configs[shift:] + configs[:shift]:
                report = Path(tmp) / f"r{rep}-{len(runs)}.json"
                advised = label not in ("bare", ALONE)
                full = with_json(cmd, report, args.script) if advised else cmd
                print(f"  rep {rep + 1}/{args.reps} {label:24s} ...", end="", flush=True, file=sys.stderr)
                extra = alone_env(args, Path(tmp) / f"s{rep}") if label == ALONE else {}
                run = timed_run(full, {**env, **extra}, label, rep)
                if advised:
                    run.deep, run.timed = report_steps(report)
                print(f" {len(run.stamps)} step lines in {run.wall_s:.1f} s", file=sys.stderr)
                runs.append(run)
    return runs


def excluded(runs: list[Run], warmup: int) -> set[int]:
    """Warm-up steps, plus each deep step of any run with its neighbours (see module docstring)."""
    out = set(range(warmup))
    for run in runs:
        for d in run.deep:
            out |= {d - 1, d, d + 1}
    return out


def summarise(runs: list[Run], args: argparse.Namespace, commands: list[tuple[str, list[str]]]) -> int:
    drop = excluded(runs, args.warmup)
    common = set.intersection(*(set(r.intervals()) for r in runs)) - drop
    if not common:
        print("no steady-state steps left to compare: raise --steps", file=sys.stderr)
        return 1
    kept = sorted(common)
    labels = [label for label, _ in commands]
    med: dict[tuple[str, int], float] = {}
    p20: dict[tuple[str, int], float] = {}
    load: dict[tuple[str, int], float] = {}
    pooled: dict[str, list[float]] = {label: [] for label in labels}
    steps: dict[tuple[str, int], list[float]] = {}
    for run in runs:
        series = [run.intervals()[i] for i in kept]
        steps[(run.config, run.rep)] = series
        med[(run.config, run.rep)] = statistics.median(series)
        p20[(run.config, run.rep)] = low(series)
        load[(run.config, run.rep)] = run.load
        pooled[run.config].extend(series)

    deep = sorted(set().union(*(r.deep for r in runs)))
    print()
    threads = f", OMP_NUM_THREADS={args.threads}" if args.threads else ""
    print(f"{os.path.relpath(args.script, ROOT)} {args.script_args or '(default args)'}, --steps {args.steps}, "
          f"{args.reps} repetitions{threads}")
    print(f"steady-state steps compared: {len(kept)} per run (indices {kept[0]}..{kept[-1]}); "
          f"excluded warm-up 0..{args.warmup - 1} and deep steps {deep} with neighbours")
    for label, cmd in commands:
        if label == ALONE:
            print(f"  {label:24s} advisor.agent.bootstrap {os.path.relpath(args.script, ROOT)} ... with the "
                  "settings of attach and no socket (records spilled to a file)")
            continue
        shown = with_json(cmd, Path("R"), args.script) if label != "bare" else cmd
        print(f"  {label:24s} {display(shown, args.script)}")
    print()
    reps = range(args.reps)
    head = " ".join(f"{'rep ' + str(r + 1):>8s}" for r in reps)
    print(f"{'median step time (ms)':24s} {head} {'pooled':>8s}   load avg at start")
    for label in labels:
        cells = " ".join(f"{med[(label, r)] * 1e3:8.1f}" for r in reps)
        loads = " ".join(f"{load[(label, r)]:.1f}" for r in reps)
        print(f"{label:24s} {cells} {statistics.median(pooled[label]) * 1e3:8.1f}   {loads}")
    for title, stat in (("ratio to bare (median)", med), ("ratio to bare (p20)", p20)):
        print()
        print(f"{title:24s} {head} {'median':>8s} {'min..max':>13s}"
              + (f" {'pooled':>8s} {'95% interval':>15s}" if stat is med else ""))
        for label in labels[1:]:
            ratios = [stat[(label, r)] / stat[("bare", r)] for r in reps]
            cells = " ".join(f"{x:8.3f}" for x in ratios)
            line = f"{label:24s} {cells} {statistics.median(ratios):8.3f} {min(ratios):6.3f}..{max(ratios):.3f}"
            if stat is med:
                lo, hi = bootstrap_interval(steps, label, reps)
                line += f" {statistics.median(pooled[label]) / statistics.median(pooled['bare']):8.3f}"
                line += f" {lo:7.3f}..{hi:.3f}"
            print(line)
    split_by_timing(runs, kept, labels, reps)
    print(f"\ntarget for light probes: advisor / bare <= {TARGET:.2f} (median over repetitions), "
          f"the interval's upper end < 1.05")
    fastest = min(med[(label, r)] for label in labels for r in reps)
    noisy = [r + 1 for r in reps if any(med[(label, r)] > 2 * fastest for label in labels)]
    if noisy:
        print(f"warning: repetitions {noisy} ran at over twice the fastest median step time (other load on the "
              f"machine); their ratios measure the load, not the advisor. Re-run.")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each configuration (default 3)")
    p.add_argument("--warmup", type=int, default=5, help="leading steps excluded (default 5)")
    p.add_argument("--probes", default=None,
                   help="passed to advisor attach --probes (default: the advisor's default, all)")
    p.add_argument("--threads", type=int, default=1,
                   help="OMP_NUM_THREADS for every run (default 1; 0 leaves the environment as it is)")
    p.add_argument("--script", type=Path, default=SCRIPT,
                   help="the training script (default examples/gpt.py); it takes --steps N and prints "
                        "'step i loss x' lines")
    p.add_argument("--script-args", default="", help='extra arguments for the script, e.g. "--layers 8"')
    p.add_argument("--split", action="store_true",
                   help="also run the training process's agent alone, without the controller process (the "
                        "settings attach gives it, records spilled to a file): what the training process pays "
                        "against what the second process costs it")
    args = p.parse_args(argv)
    args.script = args.script.resolve()
    if args.steps < args.warmup + 3 or args.reps < 1:
        p.error("need --reps >= 1 and --steps >= --warmup + 3")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--inproc"]:  # agent installed vs not, interleaved in one process
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import overhead_inproc

        return overhead_inproc.main(argv[1:])
    args = parse_args(argv)
    commands = configurations(args)
    print(f"running {len(commands)} configurations x {args.reps} repetitions ...", file=sys.stderr)
    try:
        runs = measure(args)
    except RuntimeError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    return summarise(runs, args, commands)


if __name__ == "__main__":
    raise SystemExit(main())
