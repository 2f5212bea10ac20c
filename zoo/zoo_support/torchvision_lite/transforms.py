"""``Compose``, ``ToTensor`` and ``Normalize`` with torchvision's arithmetic."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, img: Any) -> Any:
        for transform in self.transforms:
            img = transform(img)
        return img


class ToTensor:
    """uint8 HWC -> float CHW in [0, 1], as torchvision's ``to_tensor``."""

    def __call__(self, pic: np.ndarray) -> torch.Tensor:
        img = torch.from_numpy(np.ascontiguousarray(pic)).permute(2, 0, 1).contiguous()
        return img.to(dtype=torch.get_default_dtype()).div(255)


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean, self.std = list(mean), list(std)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return tensor.sub(mean).div(std)
