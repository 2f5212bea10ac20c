"""What the zoo's scripts import where their own dependency cannot run offline.

The scripts in zoo/ import this package only on lines marked ``# zoo:``. ``digest`` prints one
line that fingerprints a trained model, for the scripts that neither print their losses in full
nor write a checkpoint: the conformance runner compares that line between a bare run and a run
under ``advisor attach``.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist


def digest(*modules: torch.nn.Module, label: str = "weights") -> str:
    """SHA-256 over the bytes of every tensor in the modules' state dicts, printed by rank 0.

    Names are left out, so that a remedy that wraps a module (and renames its keys) keeps the
    digest of the same weights. DTensors (FSDP2, tensor parallel) are gathered first: a
    collective, so every rank must call this.
    """
    sha = hashlib.sha256()
    for module in modules:
        for value in module.state_dict().values():
            if not isinstance(value, torch.Tensor):
                continue
            if hasattr(value, "full_tensor"):
                value = value.full_tensor()
            flat = value.detach().cpu().contiguous().reshape(-1)
            sha.update(str(flat.dtype).encode())
            sha.update(flat.view(torch.uint8).numpy().tobytes())
    text = sha.hexdigest()[:32]
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"zoo: {label} sha256 {text}", flush=True)
    return text
