"""What the agent and the DataLoader remedy tell the controller about a DataLoader.

One description, sent in ``dataloader`` events when the agent captures a loader
(``advisor/agent/capture.py``) and when the remedy changes one (``apply/remedies/dataloader.py``);
read as ``DataLoaderSettings`` by the input rule.
"""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data import DataLoader


def loader_settings(loader: DataLoader, index: int) -> dict[str, Any]:
    """What the input rule reads of a DataLoader (``Profile.loaders``; ``dataloader`` events)."""
    sampler = getattr(loader, "sampler", None)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {
        "index": index,
        "num_workers": int(loader.num_workers),
        "pin_memory": bool(loader.pin_memory),
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": bool(loader.persistent_workers),
        "batch_size": loader.batch_size,
        "sampler": type(sampler).__name__ if sampler is not None else None,
        "seeded": loader.generator is not None,
        "cpu_count": cpus,
    }
