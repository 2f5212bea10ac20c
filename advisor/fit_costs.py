"""Device memory a GPU job uses beside its tensors, which a fit cannot track: each stated as measured
or assumed, with where the figure comes from.

- The CUDA context and the libraries' own memory (kernel images, cuBLAS and cuDNN handles): what
  NVML counts for the process beyond the caching allocator's reserve. Measured by this project on
  an H100 80GB HBM3 (torch 2.11, CUDA 13): 794,820,608 bytes at the first deep step of a GPT
  session (tests/data/gpt_h100.jsonl.gz, ``cuda_memory.device_used_outside_torch_bytes``). Other
  parts are assumed to need the same.
- cuBLAS workspaces: PyTorch gives each cuBLAS handle a workspace from the caching allocator
  (so ``memory_allocated`` counts it) of ``CUBLAS_WORKSPACE_CONFIG``'s default size: 32 MiB on
  compute capability 9.0, 8 MiB + 128 KiB before it. A training step uses two handles: the
  script's thread (forward, optimizer) and autograd's device thread (backward). Assumed, from
  PyTorch's defaults.
- NCCL's buffers: per communicator (each process group of more than one rank the script makes,
  on each of its devices), its channels' send and receive buffers for each protocol. Assumed:
  512 MiB per communicator, a round figure for NVLink rings at NCCL's default ``NCCL_BUFFSIZE``;
  NVLink SHARP (NVLS) and more channels take more, ``NCCL_BUFFSIZE`` and ``NCCL_NVLS_ENABLE=0``
  less. Not measured here: no GPU was available to this project's fit work.

The caching allocator's reserve beyond what it has handed out (blocks cached after a free, split
segments) is not predicted: it depends on the order of frees. Its block rounding is: a fit's
tracked bytes on a GPU target are the allocator's 512-byte blocks
(``probes/memory/cuda.allocator_block_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.records.fit import MIB, FitSettings

CUDA_CONTEXT_BYTES = 794_820_608
CUBLAS_WORKSPACE_HOPPER = 32 * MIB
CUBLAS_WORKSPACE_DEFAULT = 8 * MIB + 128 * 1024
CUBLAS_HANDLES = 2
NCCL_COMMUNICATOR_BYTES = 512 * MIB


@dataclass(frozen=True, kw_only=True)
class FixedCost:
    name: str
    bytes: int
    source: str  # "measured" | "assumed"
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "source": self.source, "note": self.note}


def fixed_costs(fit: FitSettings, communicators: list[int]) -> list[FixedCost]:
    """The memory beside the tensors on each device of the planned job; none on a CPU target."""
    device = fit.device
    if device is None:
        return []
    workspace = CUBLAS_WORKSPACE_HOPPER if device.capability >= (9, 0) else CUBLAS_WORKSPACE_DEFAULT
    costs = [
        FixedCost(name="CUDA context and libraries", bytes=CUDA_CONTEXT_BYTES, source="measured",
                  note="NVML's per-process bytes beyond the allocator's reserve, on an H100 80GB HBM3 "
                       "(torch 2.11); assumed the same on other parts"),
        FixedCost(name="cuBLAS workspaces", bytes=CUBLAS_HANDLES * workspace, source="assumed",
                  note=f"{CUBLAS_HANDLES} handles (the script's thread, autograd's) x {workspace // 1024} KiB, "
                       "PyTorch's default CUBLAS_WORKSPACE_CONFIG for the part; the allocator counts them"),
    ]
    groups = [size for size in communicators if size > 1]
    if groups:
        costs.append(FixedCost(
            name="NCCL buffers", bytes=len(groups) * NCCL_COMMUNICATOR_BYTES, source="assumed",
            note=f"{len(groups)} communicator(s) of {', '.join(str(s) for s in groups)} ranks x "
                 f"{NCCL_COMMUNICATOR_BYTES // MIB} MiB each (NCCL's channels and protocols at its default "
                 "buffer size; NCCL_BUFFSIZE and NVLink SHARP change it)"))
    return costs
