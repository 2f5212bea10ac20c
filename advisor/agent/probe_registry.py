"""Which probes an agent runs, and what it says about its device."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from advisor.probes.comm.probe import CommProbe
from advisor.probes.compute.probe import ComputeProbe
from advisor.probes.memory.probe import MemoryProbe
from advisor.probes.probe import Probe
from advisor.records.settings import AgentSettings

# name -> class. Imported at module level like every training-side module (the bootstrap drops
# the top-level ``advisor`` name before the script runs); the three cost about 70 ms after torch.
# The agent calls start_deep in the order of ``AgentSettings.probes`` and stop_deep in reverse.
PROBES: dict[str, type[Probe]] = {  # keys: advisor.records.settings.PROBE_NAMES
    "memory": MemoryProbe,
    "compute": ComputeProbe,
    "comm": CommProbe,
}


def build_probes(settings: AgentSettings) -> tuple[list[Probe], list[str]]:
    """The enabled probes, and one warning per probe that could not be built (it is skipped:
    a broken probe must never keep the user's script from training)."""
    probes: list[Probe] = []
    warnings: list[str] = []
    for name in settings.probes:
        try:
            probes.append(PROBES[name]())
        except Exception as exc:  # noqa: BLE001
            warnings.append(f"probe {name} disabled: {type(exc).__name__}: {exc}")
    return probes, warnings


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(local_rank: int = 0) -> dict[str, Any]:
    """The device this rank trains on: CUDA device ``local_rank`` when CUDA is usable, else the CPU.

    Source: ``torch.cuda.get_device_properties`` (name, total_memory in bytes).
    """
    if torch.cuda.is_available():
        index = local_rank % max(1, torch.cuda.device_count())
        props = torch.cuda.get_device_properties(index)
        return {"type": "cuda", "name": props.name, "index": index, "count": torch.cuda.device_count(),
                "memory_capacity": int(props.total_memory),
                "capability": f"{props.major}.{props.minor}"}
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        pages = None
    return {"type": "cpu", "name": _cpu_name(), "index": None, "count": 1, "memory_capacity": pages,
            "threads": torch.get_num_threads()}
