"""The agent's settings as they cross the process boundary (``ADVISOR_CONFIG``, JSON).

Torch-free: the CLI validates them, the training process reads them.
"""

from __future__ import annotations

# The probes an agent can run, in the order it starts their deep sampling (it stops them in reverse).
PROBE_NAMES: tuple[str, ...] = ("memory", "compute", "comm")


def probe_names(value: str | None) -> list[str]:
    """Parse ``--probes memory,compute`` ("all" and "none" allowed); ValueError names valid ones."""
    if value is None or value == "all":
        return list(PROBE_NAMES)
    if value == "none":
        return []
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROBE_NAMES]
    if unknown:
        raise ValueError(f"unknown probe(s) {', '.join(unknown)}; valid: {', '.join(PROBE_NAMES)}, all, none")
    return names
