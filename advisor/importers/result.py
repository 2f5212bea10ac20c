"""What an importer hands back: records for the store, and what its artifact could not provide."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from advisor.records.samples import Record


@dataclass
class ImportResult:
    """``records`` in the agent's types; ``notes``: one line per thing the artifact lacks."""

    records: list[Record] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
