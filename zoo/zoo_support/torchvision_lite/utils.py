"""``save_image``: writes the quantised grid's raw bytes (not a PNG: no image library here)."""

from __future__ import annotations

from pathlib import Path

import torch


def save_image(tensor: torch.Tensor, fp: str, normalize: bool = False, **_: object) -> None:
    img = tensor.detach().clone().cpu()
    if normalize:
        low, high = float(img.min()), float(img.max())
        img = img.clamp(low, high).sub(low).div(max(high - low, 1e-5))
    quantised = img.mul(255).add(0.5).clamp(0, 255).to(torch.uint8)
    Path(fp).write_bytes(quantised.numpy().tobytes())
