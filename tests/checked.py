"""Every report a test produces passes ``advisor check`` (advisor/check.py).

``assert_consistent(report)`` for a report built in memory; ``reports_under(folder)`` finds the
JSON reports (``advisor.report/1``, ``advisor.diff/1``) a test wrote. tests/conftest.py checks
every report under each test's ``tmp_path`` after the test, unless the test is marked
``inconsistent_report`` (a test that writes a broken report on purpose).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from advisor.check import breach_lines, check_report

SCHEMAS = (b'"advisor.report/1"', b'"advisor.diff/1"')
MAX_REPORT_BYTES = 256 << 20


def assert_consistent(report: Mapping[str, Any], where: str = "report") -> None:
    breaches = check_report(report)
    assert not breaches, f"{where} contradicts itself:\n{breach_lines(breaches)}"


def reports_under(folder: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(path, report) for every JSON report under ``folder`` (the schema is the first key)."""
    for path in sorted(folder.rglob("*.json")):
        try:
            if not path.is_file() or path.stat().st_size > MAX_REPORT_BYTES:
                continue
            with path.open("rb") as handle:
                head = handle.read(64)
            if not any(schema in head for schema in SCHEMAS):
                continue
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # not a report (or one a test truncated on purpose): not ours to judge
        if isinstance(report, dict):
            yield path, report


def check_folder(folder: Path) -> list[str]:
    """One message per report under ``folder`` that breaks an invariant."""
    return [f"{path}:\n{breach_lines(breaches)}" for path, report in reports_under(folder)
            if (breaches := check_report(report))]
