"""``advisor fit --target cpu`` on the zoo's one-process scripts, against the peak ``advisor attach`` measures.

    python bench/fit_zoo.py                      # every one-process entry of zoo/manifest.py
    python bench/fit_zoo.py --only word_lm --keep /tmp/fit-zoo

For each entry that runs on one process, the zoo's runner (zoo/conformance.py: its data, folder,
environment and arguments, the entry's smoke step count) runs it under ``advisor attach --headless``
and then under ``advisor fit --target cpu``; the table gives the attached report's peak
(``memory.peak_bytes``, rank 0, over the tracked steps), the fit's (``memory.tracked_peak_bytes``),
the fit's error, and each run's wall time; a fit that fails says how (its last line of stderr).
Issue 38's bound: within 5%. Figures only; the exit code is 0 when every fit ran and is within it.
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


def row(entry, home: Path) -> dict:
    steps = entry.smoke_steps
    attached = conformance.execute(entry, steps, home, "attach", [], timeout_s=entry.timeout_s)
    fitted = conformance.execute(entry, steps, home, "fit", ["--target", "cpu"], timeout_s=entry.timeout_s, verb="fit")
    measured = ((attached.report or {}).get("memory") or {}).get("peak_bytes")
    predicted = ((fitted.report or {}).get("memory") or {}).get("tracked_peak_bytes")
    failed = None
    if fitted.rc != 0 or predicted is None:
        lines = [line for line in fitted.stderr.splitlines() if line.strip()]
        failed = f"fit exit {fitted.rc}: {(lines[-1] if lines else '')[:160]}"
    elif not measured:
        failed = f"attach exit {attached.rc}: no peak"
    error = (predicted - measured) / measured if not failed else None
    return {"name": entry.name, "measured": measured, "predicted": predicted, "error": error, "failed": failed,
            "attach_s": attached.wall_s, "fit_s": fitted.wall_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this entry (repeatable)")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs' folders here")
    args = parser.parse_args(argv)
    entries = [e for e in ENTRIES if e.ranks == 1 and (not args.only or e.name in args.only)]
    home = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="advisor-fit-zoo-"))
    home.mkdir(parents=True, exist_ok=True)
    print("| script | attach peak (B) | fit peak (B) | fit error | attach s | fit s |")
    print("|---|---|---|---|---|---|")
    ok = True
    for entry in entries:
        r = row(entry, home)
        if r["failed"]:
            ok = False
            print(f"| {r['name']} | {r['measured'] or '-'} | - | {r['failed']} | {r['attach_s']:.0f} | {r['fit_s']:.0f} |",
                  flush=True)
            continue
        ok = ok and abs(r["error"]) <= BOUND
        print(f"| {r['name']} | {r['measured']:,} | {r['predicted']:,} | {r['error']:+.2%} | {r['attach_s']:.0f} | "
              f"{r['fit_s']:.0f} |", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
