"""The memory probe: categories over time, per-module attribution, budget, OOM flight recorder."""

from advisor.probes.memory.probe import MemoryProbe

__all__ = ["MemoryProbe"]
