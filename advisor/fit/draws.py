"""Random draws on fake tensors advance the real generator, as the real run's draws would.

A fit builds the model on fake tensors, so its initialisation (``kaiming_uniform_``, ``normal_``)
draws nothing from the CPU's default generator, and every real draw the script makes after it (the
DataLoader's shuffle, a random crop) comes out differently: accelerate's NLP example then padded
its batches to other lengths and the fit's peak was 19% under the measured one. So each op that
draws from a generator (ATen's ``nondeterministic_seeded`` tag) and runs where the real run would
draw from the host's generator (a host tensor, or any tensor when the target is the CPU) is
replayed for real on a scratch tensor of its shape: the generator ends where the real run's does.
Draws on the target device use its own generator in a real run and are not replayed.

Memory stays bounded: an op of up to ``SCRATCH_ELEMENTS`` elements is replayed whole; a larger
``uniform_`` or ``normal_`` (every initialiser PyTorch has) is replayed in chunks, which draw the
same numbers (the CPU kernels draw per element, ``normal_`` redraws 16 for a tail shorter than 16:
the chunks keep that tail last); any other larger op, and every op once ``BUDGET_ELEMENTS`` have
been replayed (a large model's initialisation would take minutes), is left and counted, and the
report says the script's later random choices may differ.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._pytree import tree_flatten, tree_map

SCRATCH_ELEMENTS = 1 << 24  # 64 MiB of fp32
CHUNK = 1 << 20
BUDGET_ELEMENTS = 1 << 28
_CHUNKABLE = {"uniform_", "normal_"}


def draws(func: Any) -> bool:
    """Whether ``func`` draws from a generator."""
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


class Draws:
    """Replays random ops on the host generator; counts what it could not."""

    def __init__(self) -> None:
        self.replayed = 0  # elements
        self.left: dict[str, int] = {}  # op -> calls not replayed

    def replay(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        size = max((t.numel() for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)), default=0)
        name = str(getattr(func, "overloadpacket", func)).rpartition(".")[2]
        if self.replayed + size > BUDGET_ELEMENTS or (size > SCRATCH_ELEMENTS and name not in _CHUNKABLE):
            self.left[name] = self.left.get(name, 0) + 1
            return
        try:
            with unset_fake_temporarily():
                if size <= SCRATCH_ELEMENTS:
                    func(*tree_map(_scratch, args), **tree_map(_scratch, kwargs))
                else:
                    _chunked(func, name, args, kwargs, size)
        except Exception:  # noqa: BLE001 - an op zeros are no valid input for (multinomial): left, counted
            self.left[name] = self.left.get(name, 0) + 1
            return
        self.replayed += size


def _scratch(value: Any) -> Any:
    """A real tensor of ``value``'s shape and dtype for a fake one (zeros: a valid probability, mean,
    std or bound for every random op), else ``value``."""
    if isinstance(value, FakeTensor):
        return torch.zeros(value.shape, dtype=value.dtype)
    if isinstance(value, torch.device) and value.type != "cpu":
        return torch.device("cpu")
    return value


def _chunked(func: Any, name: str, args: Any, kwargs: Any, size: int) -> None:
    """``uniform_``/``normal_`` of ``size`` elements as chunks that draw the same numbers."""
    self, rest = args[0], tuple(tree_map(_scratch, args[1:]))
    extra = tree_map(_scratch, kwargs)
    tail = size % 16 if name == "normal_" else 0
    last = 16 + tail if tail else 0  # normal_'s short tail redraws 16: kept as the last chunk
    remaining = size - last
    buffer = torch.empty(min(CHUNK, max(remaining, 1)), dtype=self.dtype)
    while remaining > 0:
        n = min(CHUNK, remaining)
        func(buffer[:n], *rest, **extra)
        remaining -= n
    if last:
        func(torch.empty(last, dtype=self.dtype), *rest, **extra)
