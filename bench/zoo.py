"""The zoo's conformance table: public training scripts, bare against ``advisor attach``.

    python bench/zoo.py                  # every entry, full steps, with the --apply auto pass
    python bench/zoo.py --smoke          # the CI subset: few steps, exactness and checker only
    python bench/zoo.py --only dcgan --only fsdp2
    python bench/zoo.py --markdown docs/zoo-table.md

Each entry of zoo/manifest.py runs bare (``python SCRIPT`` or torchrun on its ranks) and under
``python -m advisor attach --headless --json R.json``; zoo/conformance.py holds the checks (exit
code, masked stdout, bit-identical losses or checkpoints, recorded steps, the report checker, and,
without --smoke, a second attach at 70% of the measured peak with ``--apply auto``). Prints the
table, script by check, and the wall time of each run. Exit code 0 when every check passes or is
n/a, 1 otherwise. Everything is written under a temporary folder (``--keep DIR`` to keep it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))

import conformance  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="few steps, exactness and checker only (no apply pass)")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this entry (repeatable)")
    parser.add_argument("--steps", type=int, help="override every entry's step count")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR and keep the runs' folders and reports")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    args = parser.parse_args(argv)
    try:
        entries = conformance.select(args.only, smoke=args.smoke)
    except KeyError as exc:
        print(f"bench/zoo.py: {exc.args[0]}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        home = Path(args.keep) if args.keep else Path(tmp)
        home.mkdir(parents=True, exist_ok=True)
        results = []
        for entry in entries:
            start = time.perf_counter()
            result = conformance.run_entry(entry, home=home, smoke=args.smoke, steps=args.steps)
            results.append(result)
            marks = " ".join(f"{name}={check.status}" for name, check in result.checks.items())
            notes = "".join(f"; {note}" for note in result.notes)
            print(f"{entry.name}: {marks} ({time.perf_counter() - start:.0f} s{notes})", file=sys.stderr, flush=True)
        text = conformance.table(results)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    failed = any(c.status == "FAIL" for r in results for c in r.checks.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
