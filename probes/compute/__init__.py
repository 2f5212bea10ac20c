"""Per-op FLOPs, bytes and time on deep-sampled steps (the roofline's inputs)."""

from advisor.probes.compute.probe import ComputeProbe

__all__ = ["ComputeProbe"]
