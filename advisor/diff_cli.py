"""``advisor diff A B [--json FILE] [--fail-on SPEC]``: load, compare, render, gate."""

from __future__ import annotations

import sys

from advisor.diff import check_gate, compute_diff, parse_gate
from advisor.diff_render import print_diff
from advisor.errors import UsageError
from advisor.job import load_job, split_refs
from advisor.report import build_report, write_json


def run_diff(a_ref: str, b_ref: str, *, json_path: str | None, fail_on: str | None, top: int = 10) -> int:
    """0, or 1 when a ``--fail-on`` threshold is crossed (one ``regression:`` line each on stderr)."""

    thresholds = None
    if fail_on is not None:
        try:
            thresholds = parse_gate(fail_on)
        except ValueError as exc:
            raise UsageError(str(exc), hint="e.g. --fail-on step_time:+5%,peak_memory:+10%") from None
    # Either side may be the sessions of one multi-node job, comma-separated (advisor/job.py).
    a_state = load_job(split_refs(a_ref))
    b_state = load_job(split_refs(b_ref))
    diff = compute_diff(a_state, build_report(a_state), b_state, build_report(b_state), top=top)
    failures = check_gate(diff, thresholds) if thresholds else []
    diff["gate"] = {"spec": fail_on, "failures": failures}
    if json_path:
        write_json(diff, json_path)
        print(f"wrote diff {json_path}", file=sys.stderr)
    else:

        print_diff(diff)
    for failure in failures:
        print(f"advisor: regression: {failure['reason']}", file=sys.stderr)
    return 1 if failures else 0
