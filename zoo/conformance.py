"""Runs a zoo script bare and under ``advisor attach`` and checks that they behave alike.

Shared by the benchmark command (bench/zoo.py, the full table) and the CI smoke test
(tests/test_zoo_smoke.py). Checks, each "pass", "FAIL" or "n/a" with a short reason:

- ``exit``: the exit code under attach equals the bare run's.
- ``stdout``: stdout is equal once the entry's masks (wall-clock figures) are applied; on several
  ranks the lines are compared as a sorted list, since ranks interleave their lines freely.
- ``losses``: the printed losses, the ``zoo: ... sha256`` fingerprint lines and the tensors of the
  checkpoints the script wrote are bit-identical (n/a when the script gives none of them).
- ``steps``: every rank's step count in the report equals the optimizer steps the script took.
- ``checker``: the report passes ``advisor.check.check_report`` (n/a where that does not exist).
- ``apply`` (full runs only): a second attach with ``--memory-budget`` at 70% of the measured peak
  and ``--apply auto`` keeps a remedy whose measured peak is within 5% of its prediction and whose
  step time is within 10%, or says why nothing was applied; never a crash, a stall (a timeout or a
  wait for the controller) or an exit code other than the bare run's.

Every process runs offline (``HF_HUB_OFFLINE`` and friends), with one intra-op thread, no GPU, and
its caches inside the run's folder, which is emptied and refilled with the entry's data before
each run so that both runs see the same paths and files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ZOO = Path(__file__).resolve().parent
ROOT = ZOO.parent
sys.path.insert(0, str(ZOO))
sys.path.insert(0, str(ROOT))  # this checkout's advisor (for advisor.check), also from bench/zoo.py

from manifest import BY_NAME, ENTRIES, Entry  # noqa: E402

CHECKS = ("exit", "stdout", "losses", "steps", "checker")
APPLY_CHECK = "apply"
BUDGET_FRACTION = 0.7
PEAK_TOLERANCE = 0.05
STEP_TIME_TOLERANCE = 0.10
SMOKE_TIMEOUT_S = 240
# Bare (reference) runs wait less than attached ones: the slowest takes 28 s alone (hf_clm_compile's
# full run), and what outlasts this is a hang of torch's own (accelerate_accum's gloo teardown,
# without the advisor), run again sooner; three of them held a suite run 12 minutes at 240 s each,
# and the full table 21 minutes at 420 s. An attached run keeps the longer limit: its stall is a defect.
BARE_TIMEOUT_S = 150
BARE_RETRIES = 3  # bare runs (without the advisor) that hang or lose a rank to a signal: run again at most this often
_STALL = "no decision from the controller"
_DIGEST_LINE = re.compile(r"^zoo: .* sha256 [0-9a-f]+$", re.M)


@dataclass
class Run:
    """One process tree: how it was started and what it left."""

    kind: str  # "bare", "attach" or "apply"
    cmd: list[str]
    rc: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool
    report: dict[str, Any] | None
    artifacts: dict[str, str | None]


@dataclass(frozen=True, kw_only=True)
class Check:
    status: str  # "pass", "FAIL", "n/a"
    reason: str = ""


@dataclass
class EntryResult:
    entry: Entry
    steps: int
    runs: dict[str, Run] = field(default_factory=dict)
    checks: dict[str, Check] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _format(value: str, entry: Entry, steps: int, run: Path) -> str:
    return value.format(run=run, steps=steps, last=steps - 1, size=entry.size(steps))


def _environment(entry: Entry, steps: int, run: Path, home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(run / ".hf"), "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0",
        "ADVISOR_HOME": str(home / "advisor-home"), "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
        # this checkout's advisor, and zoo_support for the scripts' marked lines
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ZOO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    })
    env.update({k: _format(v, entry, steps, run) for k, v in entry.env.items()})
    return env


def command(entry: Entry, steps: int, run: Path, *, attach: list[str] | None, verb: str = "attach") -> list[str]:
    """The bare command (``attach`` None) or the ``advisor attach`` one with those options (``verb``
    "fit": ``advisor fit`` with them, on the entry's world size)."""
    script = str(ZOO / entry.script)
    args = [_format(a, entry, steps, run) for a in entry.args]
    if attach is None:
        if entry.ranks == 1:
            return [sys.executable, script, *args]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(entry.ranks), script, *args]
    ranks = ["--nproc-per-node", str(entry.ranks)] if entry.ranks > 1 else []
    headless = ["--headless"] if verb == "attach" else []
    return [sys.executable, "-m", "advisor", verb, *headless, *ranks, *attach, script, *args]


def execute(entry: Entry, steps: int, home: Path, kind: str, attach: list[str] | None, *, timeout_s: int,
            verb: str = "attach") -> Run:
    """Empty the run folder, copy the entry's data in, run one command and collect its results
    (``verb`` "fit": ``advisor fit`` writes the report)."""
    base = home / entry.name
    data, run = base / "data", base / "run"
    if entry.prepare is not None and not data.exists():
        import datagen

        data.mkdir(parents=True)
        datagen.PREPARE[entry.prepare](data, steps)
    shutil.rmtree(run, ignore_errors=True)
    if data.exists():
        shutil.copytree(data, run)
    else:
        run.mkdir(parents=True)
    report_path = base / f"{kind}.json"
    report_path.unlink(missing_ok=True)
    attach_args = None if attach is None else ["--json", str(report_path), *attach]
    cmd = command(entry, steps, run, attach=attach_args, verb=verb)
    cwd = run if entry.cwd == "run" else (ZOO / entry.script).parent
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=_environment(entry, steps, run, home), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_tree(proc.pid)
        out, err = proc.communicate()
    wall = time.perf_counter() - start
    (base / f"{kind}.stdout").write_text(out)  # kept for a look at a failed check
    (base / f"{kind}.stderr").write_text(err)
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    artifacts = {pattern: _glob_digest(run, pattern) for pattern in entry.artifacts}
    return Run(kind=kind, cmd=cmd, rc=None if timed_out else proc.returncode, stdout=out, stderr=err,
               wall_s=wall, timed_out=timed_out, report=report, artifacts=artifacts)


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant. torchrun starts its ranks in sessions of their
    own, so killing the launcher's process group leaves a stuck rank holding the output pipe."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    for member in tree:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _glob_digest(run: Path, pattern: str) -> str | None:
    files = sorted(run.glob(pattern))
    if not files:
        return None
    sha = hashlib.sha256()
    for path in files:
        sha.update(_file_digest(path).encode())
    return f"{len(files)} file(s) {sha.hexdigest()[:16]}"


def _file_digest(path: Path) -> str:
    """Tensors only: a torch.save archive's storage records (its pickle names paths and times,
    and is never unpickled here); any other file, its bytes."""
    sha = hashlib.sha256()
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            for name in sorted(n for n in archive.namelist() if "/data/" in n and not n.endswith(".pkl")):
                sha.update(archive.read(name))
    else:
        sha.update(path.read_bytes())
    return sha.hexdigest()


def masked_stdout(text: str, entry: Entry) -> list[str]:
    """Lines with the masks applied (a line that is all mask is left out). Ranks share one pipe and cut into each other's lines at
    any write, even inside a word, so on several ranks what is compared is the sorted list of
    the characters (less whitespace): nothing missing, nothing added, whatever the interleaving."""
    lines = re.split(r"\r\n|\r|\n", text)
    for mask in entry.masks:
        lines = [re.sub(mask, "<masked>", line) for line in lines]
    # trailing blanks never mean anything (progress bars pad to a width); a line masked whole is left out
    lines = [line.rstrip() for line in lines if line != "<masked>"]
    if entry.ranks > 1:
        return sorted(char for line in lines for char in line if not char.isspace())
    return lines


def _first_difference(a: list[str], b: list[str], entry: Entry) -> str:
    if entry.ranks > 1:
        extra, missing = Counter(b) - Counter(a), Counter(a) - Counter(b)
        return f"characters added {''.join(sorted(extra.elements()))[:30]!r}, missing {''.join(sorted(missing.elements()))[:30]!r}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i + 1}: {x[:60]!r} vs {y[:60]!r}"
    return f"{len(a)} lines vs {len(b)}"


def check_exit(bare: Run, other: Run) -> Check:
    if other.timed_out:
        return Check(status="FAIL", reason=f"timed out after {other.wall_s:.0f} s")
    if bare.rc != other.rc:
        return Check(status="FAIL", reason=f"exit {other.rc}, bare {bare.rc}")
    return Check(status="pass", reason=f"exit {bare.rc}")


def check_stdout(bare: Run, other: Run, entry: Entry) -> Check:
    a, b = masked_stdout(bare.stdout, entry), masked_stdout(other.stdout, entry)
    if a != b:
        return Check(status="FAIL", reason=_first_difference(a, b, entry))
    return Check(status="pass", reason=f"{len(a)} {'characters' if entry.ranks > 1 else 'lines'}")


def check_losses(bare: Run, other: Run, entry: Entry) -> Check:
    compared, differ = [], []
    if entry.loss_pattern is not None:
        a = re.findall(entry.loss_pattern, bare.stdout, re.M)
        b = re.findall(entry.loss_pattern, other.stdout, re.M)
        if a or b:
            (compared if a == b else differ).append(f"{len(a)} printed losses" + ("" if a == b else f" vs {len(b)}"))
    a, b = _DIGEST_LINE.findall(bare.stdout), _DIGEST_LINE.findall(other.stdout)
    if a or b:
        (compared if a == b else differ).append("weights fingerprint")
    for pattern, digest in bare.artifacts.items():
        theirs = other.artifacts.get(pattern)
        if digest is None and theirs is None:
            continue
        (compared if digest == theirs else differ).append(f"checkpoint {pattern}")
    if differ:
        return Check(status="FAIL", reason="differ: " + ", ".join(differ))
    if not compared:
        return Check(status="n/a", reason="the script prints no loss and writes no checkpoint")
    return Check(status="pass", reason="equal: " + ", ".join(compared))


def check_steps(other: Run, entry: Entry, steps: int) -> Check:
    if other.report is None:
        return Check(status="FAIL", reason="no report")
    expected = entry.expected_steps(steps)
    counts: dict[int, int] = {}
    for step in other.report.get("steps", []):
        counts[step.get("rank", 0)] = counts.get(step.get("rank", 0), 0) + 1
    wrong = {rank: n for rank, n in sorted(counts.items()) if n != expected}
    if len(counts) != entry.ranks or wrong:
        seen = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items())) or "none"
        return Check(status="FAIL", reason=f"recorded {seen}; the script took {expected}")
    return Check(status="pass", reason=f"{expected} per rank")


def check_report(other: Run) -> Check:
    """``advisor.check.check_report`` on the report, when this checkout has it. The editable
    install can lend a missing submodule from another checkout; a checker from there would judge
    reports of an advisor it was not written with, so it counts as absent."""
    try:
        import advisor.check as module
    except ImportError:
        return Check(status="n/a", reason="advisor.check not available")
    if not Path(module.__file__).resolve().is_relative_to(ROOT):
        return Check(status="n/a", reason="advisor.check is not in this checkout")
    if other.report is None:
        return Check(status="FAIL", reason="no report")
    breaches = module.check_report(other.report)
    if breaches:
        return Check(status="FAIL", reason=f"{len(breaches)} breach(es): {str(breaches[0])[:90]}")
    return Check(status="pass")


def measured_peak(report: dict[str, Any] | None) -> int | None:
    if report is None:
        return None
    peak = (report.get("memory") or {}).get("peak_bytes")
    return int(peak) if peak else None


def check_apply(bare: Run, applied: Run) -> Check:
    """The ``--apply auto`` run at 70% of the peak: kept within bounds, or an honest "nothing fits";
    never a stall, a crash, a changed exit code, or a choice it may not apply."""
    problems = []
    if applied.timed_out:
        problems.append(f"stall: timed out after {applied.wall_s:.0f} s")
    elif _STALL in applied.stderr:
        problems.append("stall: the ranks waited for the controller's decision")
    if not applied.timed_out and applied.rc != bare.rc:
        problems.append(f"exit {applied.rc}, bare {bare.rc}")
    refused = [line for line in applied.stderr.splitlines() if line.startswith("advisor: not applied:")]
    if refused:
        problems.append(refused[0].removeprefix("advisor: ")[:100])
    if applied.report is None:
        return Check(status="FAIL", reason="; ".join(problems + ["no report"]))
    entries = [a for a in applied.report.get("applied", []) if a.get("rank", 0) == 0]
    kept = [a for a in entries if a.get("status") == "kept"]
    if kept:
        verdict = _check_kept(kept[-1])
        if problems or verdict.status != "pass":
            return Check(status="FAIL", reason="; ".join(problems + [verdict.reason]))
        return verdict
    if entries:
        last = entries[-1]
        problems.append(f"{last.get('remedy')} {last.get('status')}: "
                        f"{(last.get('reason') or last.get('error') or '')[:90]}")
        return Check(status="FAIL", reason="; ".join(problems))
    said = "--apply auto applied nothing"
    # from the words on: a progress bar may share the line (tqdm writes no newline)
    unfit = [line[line.index(said):] for line in applied.stderr.splitlines() if said in line]
    if problems:
        return Check(status="FAIL", reason="; ".join(problems))
    if unfit:
        return Check(status="pass", reason="nothing fits: " + unfit[0].removeprefix("advisor: ")[:100])
    return Check(status="FAIL", reason="nothing applied, and nothing says why")


def _check_kept(entry: dict[str, Any]) -> Check:
    predicted = entry.get("predicted") or {}
    after = (entry.get("measured") or {}).get("after") or {}
    problems, figures = [], []
    for key, tolerance, unit in (("peak_memory_bytes", PEAK_TOLERANCE, "peak"),
                                 ("step_time_s", STEP_TIME_TOLERANCE, "step time")):
        p, m = predicted.get(key), after.get(key)
        if key == "step_time_s" and predicted.get("rebased_step_time_s"):
            # The predicted change on the job's speed at the apply (the before window), the
            # reference the executor judges by: the job's own speed moves between the advice's
            # steps and the apply (warming up, the other rank's process on the same cores).
            p, unit = predicted["rebased_step_time_s"], "step time (rebased)"
        if not p or m is None:
            problems.append(f"{unit}: not measured" if p else f"{unit}: no prediction")
            continue
        error = (m - p) / p
        figures.append(f"{unit} {error:+.0%}" + (f" ({after.get('step_kind')} steps)" if key == "step_time_s" else ""))
        if key == "step_time_s" and predicted.get("step_time_s") and p != predicted["step_time_s"]:
            figures[-1] += f", {(m - predicted['step_time_s']) / predicted['step_time_s']:+.0%} on the advice's base"
        if abs(error) > tolerance:
            problems.append(f"{unit} {error:+.0%} off (bound {tolerance:.0%}"
                            + (f", timed on {after.get('step_kind')} steps)" if key == "step_time_s" else ")"))
    remedy = entry.get("remedy")
    if problems:
        return Check(status="FAIL", reason=f"kept {remedy}: " + "; ".join(problems))
    return Check(status="pass", reason=f"kept {remedy}: " + ", ".join(figures))


# torchrun's failure table for a rank that died of a signal ("exitcode  : -6 (pid: 592)").
_RANK_KILLED = re.compile(r"exitcode\s*:\s*-\d+ \(pid")


def run_entry(entry: Entry, *, home: Path, smoke: bool, steps: int | None = None,
              apply: bool | None = None) -> EntryResult:
    """Bare, then attach (then, unless smoke, the apply pass), and every check."""
    steps = steps if steps is not None else (entry.smoke_steps if smoke else entry.full_steps)
    timeout = min(entry.timeout_s, SMOKE_TIMEOUT_S) if smoke else entry.timeout_s
    result = EntryResult(entry=entry, steps=steps)
    bare_timeout = min(timeout, BARE_TIMEOUT_S)
    bare = execute(entry, steps, home, "bare", None, timeout_s=bare_timeout)
    hangs = killed = 0
    while hangs + killed < BARE_RETRIES:
        # Without the advisor: a hang of the script or of torch itself (one gloo rank of the
        # accelerate example hung in 1 of 5 bare runs here, and twice in a row in a full suite
        # run on 2 loaded cores), or a rank killed by a signal at teardown (a gloo rank of
        # ddp_tutorial, then of tensor_parallel twice in a row, aborted at exit: "terminate called
        # without an active exception"). Again, and say so; an attached run is never run again.
        if bare.timed_out:
            hangs += 1
        elif bare.rc and _RANK_KILLED.search(bare.stderr):
            killed += 1
        else:
            break
        bare = execute(entry, steps, home, "bare", None, timeout_s=bare_timeout)
    if hangs:
        result.notes.append(f"the bare run timed out {hangs} time(s) and was run again")
    if killed:
        result.notes.append(f"a rank of the bare run died of a signal {killed} time(s) and it was run again")
    result.runs["bare"] = bare
    other = result.runs["attach"] = execute(entry, steps, home, "attach", [], timeout_s=timeout)
    result.checks["exit"] = check_exit(bare, other)
    result.checks["stdout"] = check_stdout(bare, other, entry)
    result.checks["losses"] = check_losses(bare, other, entry)
    result.checks["steps"] = check_steps(other, entry, steps)
    result.checks["checker"] = check_report(other)
    if apply if apply is not None else not smoke:
        peak = measured_peak(other.report)
        if peak is None:
            result.checks[APPLY_CHECK] = Check(status="n/a", reason="no measured peak to budget against")
        else:
            budget = int(peak * BUDGET_FRACTION)
            run = result.runs["apply"] = execute(entry, steps, home, "apply",
                                                 ["--memory-budget", f"{budget}B", "--apply", "auto"], timeout_s=timeout)
            result.checks[APPLY_CHECK] = check_apply(bare, run)
    return result


def select(names: list[str] | None, *, smoke: bool) -> list[Entry]:
    if names:
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise KeyError(f"unknown zoo entries {unknown}; known: {', '.join(BY_NAME)}")
        return [BY_NAME[n] for n in names]
    return [e for e in ENTRIES if e.smoke or not smoke]


def table(results: list[EntryResult]) -> str:
    """A markdown table, script by check, each cell "pass"/"FAIL"/"n/a" and its reason."""
    columns = list(CHECKS) + ([APPLY_CHECK] if any(APPLY_CHECK in r.checks for r in results) else [])
    head = "| script | ranks | steps | bare s | attach s | " + " | ".join(columns) + " |"
    rule = "|" + "---|" * (5 + len(columns))
    rows = [head, rule]
    for r in results:
        cells = []
        for name in columns:
            check = r.checks.get(name)
            cells.append("" if check is None else (check.status + (f": {check.reason}" if check.reason else ""))
                         .replace("|", "/"))
        bare, attach = r.runs.get("bare"), r.runs.get("attach")
        rows.append(f"| {r.entry.name} | {r.entry.ranks} | {r.steps} | {bare.wall_s:.0f} | {attach.wall_s:.0f} | "
                    + " | ".join(cells) + " |")
    return "\n".join(rows)
