"""A long run's cost to the controller: memory per step folded live, and the time to report it.

    python bench/long_run.py [STEPS]     (default 1,000,000)

Feeds STEPS step records (with phases and a loss, as an agent sends them) through the
controller's receive path (``parse_record`` then ``LiveState.add``) and prints the resident
memory before and after, per step; then writes the same steps into a session store and
times ``load_state`` + ``build_report`` on it. Figures only; nothing here is asserted.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

os.environ.setdefault("ADVISOR_HOME", tempfile.mkdtemp(prefix="advisor-bench-"))

from advisor.intake import parse_record  # noqa: E402
from advisor.paths import DB_NAME, new_session_dir  # noqa: E402
from advisor.records.samples import RunInfo, StepSample  # noqa: E402
from advisor.report import build_report  # noqa: E402
from advisor.state import LiveState  # noqa: E402
from advisor.store import SessionStore, load_state  # noqa: E402


def _rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _step(index: int) -> dict:
    t = 0.01 + (index % 7) * 1e-4
    return StepSample(index=index, time_s=t, loss=1.0 / (index + 1), micro_batches=1, end_time=1.7e9 + index,
                      phases={"data_s": t * 0.1, "forward_s": t * 0.3, "backward_s": t * 0.4,
                              "optimizer_s": t * 0.1, "other_s": t * 0.1}).to_dict()


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    live = LiveState()
    live.add(RunInfo(script="bench.py", argv=[]))
    before = _rss_mb()
    started = time.perf_counter()
    for index in range(steps):
        live.add(parse_record("step", _step(index)))
    fold_s = time.perf_counter() - started
    after = _rss_mb()
    print(f"live: {steps:,} steps folded in {fold_s:.1f} s; RSS {before:.0f} -> {after:.0f} MB "
          f"({(after - before) * 1024 * 1024 / steps:.0f} bytes/step)")

    folder = new_session_dir("bench.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, finished=True, exit_code=0, exit_reason="completed")
    store.put(RunInfo(script="bench.py", argv=[]))
    for index in range(steps):
        store.put(StepSample(**_step(index)))
    store.close()
    size = (folder / DB_NAME).stat().st_size / 1e6
    started = time.perf_counter()
    report = build_report(load_state(folder / DB_NAME))
    report_s = time.perf_counter() - started
    summary = report["summary"]
    print(f"store: {size:.0f} MB for {steps:,} steps; load_state + build_report {report_s:.1f} s "
          f"(steps {summary['steps']:,}, listed {summary['steps_listed']:,}, median {summary['median_step_s']:.5f} s)")


if __name__ == "__main__":
    main()
