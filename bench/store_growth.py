"""Session store bytes per 1000 steps as a run grows (issue 37), with a real agent's record mix.

    python bench/store_growth.py [--steps 1000000] [--marks 10000,100000,1000000] [--legacy-steps 100000]

First records a short real session (``advisor attach --headless --steps 12`` of a small
examples/gpt.py, CPU) to learn what one light step and one run of deep steps (1-3) send; then
writes a synthetic run of ``--steps`` steps through ``SessionStore`` at a training job's pace
(the writer keeps up, batch by batch), each step sending what the agent sends for it now:

- a step record every step; deep steps on the agent's schedule (1-3, then ``--deep-every 100``
  backing off, ``periodic_deep_due``), each periodic one a copy of the recorded steps 1-3's records;
- the light step's memory sample through the probe's own ``LightSeries``.

It prints the file's size at each mark and bytes per 1000 steps over each decade. ``--legacy-steps``
also writes the layout before this change (every step's JSON kept, a light sample every step, a
deep run every 100th step) for the same records, for comparison. Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("ADVISOR_HOME", tempfile.mkdtemp(prefix="advisor-bench-"))

import advisor.store as store_module  # noqa: E402
from advisor.paths import DB_NAME, new_session_dir  # noqa: E402
from advisor.probes.memory.light_series import LightSeries  # noqa: E402
from advisor.records.samples import MemorySample, StepSample  # noqa: E402
from advisor.records.schedule import DEEP_STEPS, periodic_deep_due  # noqa: E402
from advisor.store import SessionStore, iter_records  # noqa: E402
from advisor.store_steps import StepWriter  # noqa: E402

GPT = ["examples/gpt.py", "--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "32", "--batch", "4",
       "--vocab", "128", "--device", "cpu"]


def _record_session() -> list:
    home = tempfile.mkdtemp(prefix="advisor-bench-rec-")
    env = {**os.environ, "ADVISOR_HOME": home, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--steps", "12", *GPT],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    [db] = Path(home).glob(f"sessions/*/{DB_NAME}")
    return list(iter_records(db))


def _templates(records: list) -> tuple[StepSample, StepSample, MemorySample, list]:
    steps = {r.index: r for r in records if isinstance(r, StepSample)}
    light = next(s for i, s in sorted(steps.items()) if i > 3 and not s.deep)
    deep_other = [r for r in records if not isinstance(r, StepSample) and getattr(r, "step", None) in DEEP_STEPS]
    sample = next(r for r in records if isinstance(r, MemorySample) and r.step == light.index)
    return light, steps[1], sample, deep_other


class _LegacySteps(StepWriter):
    def insert(self, conn, record) -> None:
        store_module._insert(conn, record)  # noqa: SLF001

    def trim(self, conn) -> None:
        pass


def _write(total: int, marks: list[int], templates: tuple, *, legacy: bool) -> list[tuple[int, int]]:
    light, deep_step, sample, deep_other = templates
    folder = new_session_dir("bench.py")
    store = SessionStore(folder / DB_NAME)
    if legacy:  # the layout before: every step's JSON among the other records
        store._steps = _LegacySteps()  # noqa: SLF001 - the bench compares the two layouts of one writer
    series = LightSeries()
    sizes = []
    deep_until = -1
    for index in range(total):
        periodic = periodic_deep_due(index, 100) if not legacy else index > 0 and index % 100 == 0
        if index in DEEP_STEPS or periodic:
            deep_until = index + 2  # the recorded run of deep steps 1-3
            for record in deep_other:
                store.put(dataclasses.replace(record, step=index + record.step - 1))
        deep = index <= deep_until
        if not deep:
            now = dataclasses.replace(sample, step=index)
            for ready in ([now] if legacy else series.offer(now)):
                store.put(ready)
        store.put(dataclasses.replace(deep_step if deep else light, index=index))
        if index % 200 == 199:
            store.flush()
        if index + 1 in marks:
            store.flush(checkpoint=True)
            sizes.append((index + 1, (folder / DB_NAME).stat().st_size))
    store.close()
    return sizes


def _print(name: str, sizes: list[tuple[int, int]]) -> None:
    before = (0, 0)
    for steps, size in sizes:
        rate = (size - before[1]) / (steps - before[0]) * 1000
        print(f"{name}: {steps:>9,} steps  {size / 1e6:8.1f} MB  {rate / 1e3:7.1f} KB per 1000 steps "
              f"(steps {before[0]:,}-{steps:,})")
        before = (steps, size)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--marks", default="10000,100000,1000000")
    parser.add_argument("--legacy-steps", type=int, default=100_000)
    args = parser.parse_args()
    templates = _templates(_record_session())
    light, deep_step, sample, deep_other = templates
    print(f"recorded: light step record {len(json.dumps(light.to_dict()))} B, light memory sample "
          f"{len(json.dumps(sample.to_dict()))} B, deep steps 1-3: {len(deep_other)} other records")
    marks = sorted({int(m) for m in args.marks.split(",") if int(m) <= args.steps} | {args.steps})
    started = time.perf_counter()
    _print("now", _write(args.steps, marks, templates, legacy=False))
    print(f"  ({time.perf_counter() - started:.0f} s)")
    if args.legacy_steps:
        legacy_marks = [m for m in marks if m <= args.legacy_steps] or [args.legacy_steps]
        _print("before", _write(args.legacy_steps, legacy_marks, templates, legacy=True))


if __name__ == "__main__":
    main()
