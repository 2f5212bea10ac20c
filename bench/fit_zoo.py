"""``advisor fit --target cpu`` on the zoo's one-process scripts, against the peak ``advisor attach`` measures.

    python bench/fit_zoo.py                      # every one-process entry of zoo/manifest.py
    python bench/fit_zoo.py --only word_lm --keep /tmp/fit-zoo
    python bench/fit_zoo.py --only dcgan --runs 3   # each side three times, alternating

For each entry that runs on one process, the zoo's runner (zoo/conformance.py: its data, folder,
environment and arguments, the entry's smoke step count) runs it under ``advisor attach --headless``
and then under ``advisor fit --target cpu``; the table gives the attached report's peak
(``memory.peak_bytes``, rank 0, over the tracked steps), the fit's (``memory.tracked_peak_bytes``),
the fit's error, and each run's wall time; a fit that fails says how (its last line of stderr).
Issue 38's bound: within 5%. Figures only; the exit code is 0 when every fit ran and is within it.

A job's peak can itself move between runs: a DataLoader with workers may hold a batch that arrives
before its turn, or not (dcgan and moe: one batch, 0.79 MB). With ``--runs N`` each side runs N
times, alternating; the table gives each side's range (least..most) and the error as the gap
between the two ranges (0 when they overlap, else from the nearest ends).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))

import conformance  # noqa: E402
from manifest import ENTRIES  # noqa: E402

BOUND = 0.05


def row(entry, home: Path, runs: int = 1) -> dict:
    steps = entry.smoke_steps
    measured, predicted, attach_s, fit_s = [], [], [], []
    failed = None
    for _ in range(runs):
        attached = conformance.execute(entry, steps, home, "attach", [], timeout_s=entry.timeout_s)
        fitted = conformance.execute(entry, steps, home, "fit", ["--target", "cpu"], timeout_s=entry.timeout_s,
                                     verb="fit")
        attach_s.append(attached.wall_s)
        fit_s.append(fitted.wall_s)
        peak = ((attached.report or {}).get("memory") or {}).get("peak_bytes")
        fit_peak = ((fitted.report or {}).get("memory") or {}).get("tracked_peak_bytes")
        if fitted.rc != 0 or fit_peak is None:
            lines = [line for line in fitted.stderr.splitlines() if line.strip()]
            failed = f"fit exit {fitted.rc}: {(lines[-1] if lines else '')[:160]}"
            break
        if not peak:
            failed = f"attach exit {attached.rc}: no peak"
            break
        measured.append(peak)
        predicted.append(fit_peak)
    error = None if failed else range_gap(measured, predicted)
    return {"name": entry.name, "measured": measured, "predicted": predicted, "error": error, "failed": failed,
            "attach_s": sum(attach_s) / len(attach_s), "fit_s": sum(fit_s) / len(fit_s)}


def range_gap(measured: list[int], predicted: list[int]) -> float:
    """The relative gap between the predicted range and the measured one: 0 when they overlap, else
    from the nearest ends (over the measured end)."""
    if max(predicted) < min(measured):
        return (max(predicted) - min(measured)) / min(measured)
    if min(predicted) > max(measured):
        return (min(predicted) - max(measured)) / max(measured)
    return 0.0


def _span(values: list[int]) -> str:
    return f"{values[0]:,}" if min(values) == max(values) else f"{min(values):,}..{max(values):,}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this entry (repeatable)")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs' folders here")
    parser.add_argument("--runs", type=int, default=1, metavar="N", help="run each side N times, alternating")
    args = parser.parse_args(argv)
    entries = [e for e in ENTRIES if e.ranks == 1 and (not args.only or e.name in args.only)]
    home = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="advisor-fit-zoo-"))
    home.mkdir(parents=True, exist_ok=True)
    print("| script | attach peak (B) | fit peak (B) | fit error | attach s | fit s |")
    print("|---|---|---|---|---|---|")
    ok = True
    for entry in entries:
        r = row(entry, home, max(1, args.runs))
        if r["failed"]:
            ok = False
            measured = _span(r["measured"]) if r["measured"] else "-"
            print(f"| {r['name']} | {measured} | - | {r['failed']} | {r['attach_s']:.0f} | {r['fit_s']:.0f} |",
                  flush=True)
            continue
        ok = ok and abs(r["error"]) <= BOUND
        print(f"| {r['name']} | {_span(r['measured'])} | {_span(r['predicted'])} | {r['error']:+.2%} | "
              f"{r['attach_s']:.0f} | {r['fit_s']:.0f} |", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
