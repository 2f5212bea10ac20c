"""``advisor fit`` against measurement: the peak a fit predicts and the peak ``advisor attach`` measures.

    python bench/fit_accuracy.py                 # every example, CPU: fit --target cpu vs attach
    python bench/fit_accuracy.py --h100          # and the recorded H100 session (tests/data)

For each example (``examples/*.py``, their default sizes, ``--device cpu``), the script is run by
``advisor attach --headless --steps 3`` and then by ``advisor fit --target cpu``; the table
gives both peaks (the memory report's, rank 0, over the tracked steps), the fit's relative error,
and how long each took. ``--h100`` adds the fit of the command recorded on an H100
(tests/data/gpt_h100.jsonl.gz, torch 2.11) against that session's tracked peak and its caching
allocator's peak (the fit's tracked peak plus its cuBLAS workspaces, which the allocator counts).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("gpt", "cnn", "ddp", "slow_input")


def _advisor(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "advisor", *args], cwd=ROOT, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait(proc: subprocess.Popen, started: float) -> float:
    _, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{proc.args} exited {proc.returncode}:\n{err[-2000:]}")
    return time.perf_counter() - started


def cpu_rows(folder: Path) -> list[dict[str, Any]]:
    rows = []
    for name in EXAMPLES:
        script = [str(ROOT / "examples" / f"{name}.py"), "--device", "cpu"]
        attached, fitted = folder / f"{name}-attach.json", folder / f"{name}-fit.json"
        started = time.perf_counter()
        attach_s = _wait(_advisor(["attach", "--headless", "--steps", "3", "--json", str(attached), *script]), started)
        started = time.perf_counter()
        fit_s = _wait(_advisor(["fit", "--target", "cpu", "--json", str(fitted), *script]), started)
        measured = json.loads(attached.read_text())["memory"]["peak_bytes"]
        predicted = json.loads(fitted.read_text())["memory"]["tracked_peak_bytes"]
        rows.append({"example": name, "measured": measured, "predicted": predicted,
                     "error": (predicted - measured) / measured, "attach_s": attach_s, "fit_s": fit_s})
    return rows


def h100_row(folder: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in gzip.open(ROOT / "tests" / "data" / "gpt_h100.jsonl.gz")]
    argv = next(r["data"]["argv"] for r in records if r["kind"] == "run")
    memory = [r["data"] for r in records if r["kind"] == "memory"]
    tracked = max(m["total_bytes"] for m in memory)
    allocated = max(m.get("allocated_bytes") or 0 for m in memory)
    report_path = folder / "h100-fit.json"
    started = time.perf_counter()
    fit_s = _wait(_advisor(["fit", "--target", "h100", "--json", str(report_path),
                            str(ROOT / "examples" / "gpt.py"), *argv]), started)
    report = json.loads(report_path.read_text())
    predicted = report["memory"]["tracked_peak_bytes"]
    workspaces = sum(c["bytes"] for c in report["memory"]["fixed_costs"] if c["name"] == "cuBLAS workspaces")
    return {"argv": " ".join(argv), "tracked": tracked, "predicted": predicted,
            "tracked_error": (predicted - tracked) / tracked, "allocated": allocated,
            "predicted_allocated": predicted + workspaces,
            "allocated_error": (predicted + workspaces - allocated) / allocated,
            "roofline_step_s": report["time"]["step_s"], "fit_s": fit_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--h100", action="store_true", help="also the recorded H100 session")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("| example | attach peak (B) | fit peak (B) | fit error | attach s | fit s |")
        print("|---|---|---|---|---|---|")
        for row in cpu_rows(folder):
            print(f"| {row['example']} | {row['measured']:,} | {row['predicted']:,} | {row['error']:+.5%} | "
                  f"{row['attach_s']:.1f} | {row['fit_s']:.1f} |")
        if args.h100:
            row = h100_row(folder)
            print(f"\nH100 (recorded, examples/gpt.py {row['argv']}):")
            print(f"  tracked peak: measured {row['tracked']:,} B, fit {row['predicted']:,} B "
                  f"({row['tracked_error']:+.5%})")
            print(f"  allocator peak: measured {row['allocated']:,} B, fit + cuBLAS workspaces "
                  f"{row['predicted_allocated']:,} B ({row['allocated_error']:+.4%})")
            print(f"  roofline step {row['roofline_step_s'] * 1e3:.1f} ms; fit took {row['fit_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
