"""The memory probe: categories over time, per-module attribution, budget, OOM flight recorder."""

from probes.memory.budget import format_size, parse_size
from probes.memory.probe import MemoryProbe

__all__ = ["MemoryProbe", "format_size", "parse_size"]
