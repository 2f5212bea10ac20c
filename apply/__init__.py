"""Remedies applied to a running job, each an ``apply_*`` function returning a revertible handle."""
