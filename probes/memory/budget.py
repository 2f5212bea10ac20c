"""The memory budget: enforce it on CUDA (sizes are parsed by ``advisor.records.units``).

On CPU the budget is enforced by the storage tracker (``advisor.probes.memory.tracker``),
which raises ``torch.OutOfMemoryError`` when tracked bytes would exceed it.
"""

from __future__ import annotations


def apply_cuda_budget(budget_bytes: int, device_index: int | None = None) -> float:
    """Cap this process's CUDA caching allocator at ``budget_bytes``; returns the fraction set.

    Uses ``torch.cuda.set_per_process_memory_fraction(budget / total)`` where total is
    ``torch.cuda.get_device_properties(device).total_memory`` (bytes). Beyond the cap the
    allocator raises ``torch.OutOfMemoryError`` as if the device were full.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("a CUDA memory budget needs a CUDA device; none is available")
    index = torch.cuda.current_device() if device_index is None else device_index
    total = torch.cuda.get_device_properties(index).total_memory
    if budget_bytes <= 0:
        raise ValueError(f"the memory budget must be positive, got {budget_bytes} bytes")
    fraction = min(1.0, budget_bytes / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction
