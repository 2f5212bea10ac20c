"""SVG snapshots of TUI screens, kept under tests/snapshots (no pytest-textual-snapshot: it pins
an older pytest). ``ADVISOR_UPDATE_SNAPSHOTS=1 pytest tests/test_tui_snapshots.py`` rewrites them."""

from __future__ import annotations

import os
import re
from pathlib import Path

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
_CLASS_HASH = re.compile(r"terminal-\d+")  # rich names its CSS classes after a hash of the theme


def normalise(svg: str) -> str:
    return _CLASS_HASH.sub("terminal", svg)


def check_snapshot(name: str, svg: str, tmp_dir: Path) -> None:
    """Compare with ``tests/snapshots/NAME.svg``; on a difference, keep the new one beside the test's
    tmp folder and fail naming both files, so a person can open them side by side."""
    path = SNAPSHOTS / f"{name}.svg"
    if os.environ.get("ADVISOR_UPDATE_SNAPSHOTS") or not path.exists():
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(svg)
        if not os.environ.get("ADVISOR_UPDATE_SNAPSHOTS"):
            raise AssertionError(f"no snapshot {path} yet: written now, check it and commit it")
        return
    if normalise(path.read_text()) != normalise(svg):
        actual = tmp_dir / f"{name}.svg"
        actual.write_text(svg)
        raise AssertionError(f"{name} differs from {path}; the screen now is in {actual} "
                             "(ADVISOR_UPDATE_SNAPSHOTS=1 accepts it)")
