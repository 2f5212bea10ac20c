"""``FakeData`` and ``CIFAR10`` as generated uint8 images (HWC numpy arrays, as PIL would give)."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch


def _size(variable: str, default: int) -> int:
    return int(os.environ.get(variable, default))


class _Generated(torch.utils.data.Dataset):
    def __init__(self, *, size: int, shape: tuple[int, int, int], num_classes: int, seed: int,
                 transform: Callable[[Any], Any] | None, target_transform: Callable[[Any], Any] | None) -> None:
        self.size, self.shape, self.num_classes, self.seed = size, shape, num_classes, seed
        self.transform, self.target_transform = transform, target_transform

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if index >= self.size:
            raise IndexError(f"{type(self).__name__} index out of range")
        rng = np.random.default_rng(self.seed * 1_000_003 + index)
        channels, height, width = self.shape
        img: Any = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
        target: Any = int(rng.integers(0, self.num_classes))
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


class FakeData(_Generated):
    def __init__(self, size: int | None = None, image_size: tuple[int, int, int] = (3, 224, 224),
                 num_classes: int = 10, transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None, random_offset: int = 0) -> None:
        super().__init__(size=size if size is not None else _size("ZOO_DATASET_SIZE", 1000),
                         shape=image_size, num_classes=num_classes, seed=1 + random_offset,
                         transform=transform, target_transform=target_transform)


class CIFAR10(_Generated):
    def __init__(self, root: str, train: bool = True, transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None, download: bool = False) -> None:
        size = _size("ZOO_DATASET_SIZE", 50000) if train else _size("ZOO_TEST_SIZE", 10000)
        super().__init__(size=size, shape=(3, 32, 32), num_classes=10, seed=2 if train else 3,
                         transform=transform, target_transform=target_transform)
