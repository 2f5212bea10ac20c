"""The few torchvision pieces the zoo's scripts use, without torchvision.

torchvision's wheel is built against one exact torch build (a CUDA one on PyPI), and its datasets
download; the zoo runs offline on the CPU wheel. Images are generated: each index seeds its own
generator, so every process (and every DataLoader worker) sees the same pixels.
Sizes: ``ZOO_DATASET_SIZE`` (training sets) and ``ZOO_TEST_SIZE`` (test sets) in the environment,
else torchvision's own sizes.
"""

from . import datasets, transforms, utils

__all__ = ["datasets", "transforms", "utils"]
