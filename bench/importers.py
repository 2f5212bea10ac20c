"""``advisor import`` against ``advisor attach`` on one run, and the trace reader's memory and speed.

    python bench/importers.py [--steps 8] [--width 1024] [--batch 512] [--ranks 1] [--events 300000]

1. Runs tests/scripts/profiled_train.py (which profiles itself with torch.profiler) under
   ``advisor attach --probes none`` (``--ranks 2``: ``--nproc-per-node 2``, DDP on gloo),
   imports the traces it wrote, and prints per rank, for the steady steps (index >= 1), the
   ratio imported / attached of the total step time and of each phase (issue 15: within 5%).
2. Writes a synthetic trace of ``--events`` CPU ops and prints its size, the reader's
   tracemalloc peak (and its ratio to the file size) and the read rate in MB/s.
Figures only; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.importers.kineto import import_traces  # noqa: E402
from advisor.importers.kineto_read import read_trace  # noqa: E402
from advisor.records.samples import StepSample  # noqa: E402


def against_attach(tmp: Path, steps: int, width: int, batch: int, ranks: int) -> None:
    out = tmp / "traces"
    env = {**os.environ, "ADVISOR_HOME": str(tmp / "home")}
    launch = ["--nproc-per-node", str(ranks)] if ranks > 1 else []
    subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", *launch, "--probes", "none", "--json",
                    str(tmp / "attach.json"), str(ROOT / "tests" / "scripts" / "profiled_train.py"), "--out", str(out),
                    "--steps", str(steps), "--width", str(width), "--batch", str(batch)],
                   cwd=ROOT, env=env, capture_output=True, check=True)
    attach_steps = json.loads((tmp / "attach.json").read_text())["steps"]
    imported = [r for r in import_traces(sorted(out.glob("rank*.json"))).records
                if isinstance(r, StepSample) and r.index > 0]
    for rank in range(ranks):
        live = {s["index"]: s for s in attach_steps if s["rank"] == rank}
        mine = [s for s in imported if s.rank == rank]
        attached = sum(live[s.index]["time_s"] for s in mine)
        print(f"rank {rank}, steady steps {len(mine)}: step time imported/attached "
              f"{sum(s.time_s for s in mine) / attached:.4f}")
        for key in ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s"):
            a = sum(live[s.index]["phases"][key] for s in mine)
            b = sum(s.phases[key] for s in mine)
            print(f"  {key:12s} attached {a * 1e3:9.2f} ms  imported {b * 1e3:9.2f} ms  ratio "
                  f"{b / a if a else float('nan'):.3f}")


def reader(tmp: Path, events: int) -> None:
    path = tmp / "big.json"
    with open(path, "w") as handle:
        handle.write('{"schemaVersion": 1, "traceEvents": [\n')
        handle.write(json.dumps({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
                                 "ts": 0, "dur": events * 10 + 10}))
        for i in range(events):
            handle.write(",\n" + json.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
                                             "ts": 1 + i * 10, "dur": 5, "args": {
                                                 "External id": i, "Input Dims": [[64, 64], [64, 64]],
                                                 "Input type": ["float", "float"], "Input Strides": [[64, 1], [64, 1]],
                                                 "Concrete Inputs": ["", ""], "Ev Idx": i}}))
        handle.write("\n]}")
    size = path.stat().st_size
    t0 = time.perf_counter()
    read_trace(path)
    elapsed = time.perf_counter() - t0
    tracemalloc.start()
    read_trace(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"trace {size / 1e6:.1f} MB, {events} ops: read at {size / 1e6 / elapsed:.1f} MB/s; "
          f"tracemalloc peak {peak / 1e6:.1f} MB = {peak / size:.3f} of the file")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--events", type=int, default=300_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        against_attach(Path(tmp), args.steps, args.width, args.batch, args.ranks)
        reader(Path(tmp), args.events)


if __name__ == "__main__":
    main()
