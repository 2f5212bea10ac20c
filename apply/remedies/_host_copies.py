"""Host buffers and copy streams shared by the offload appliers (a helper, not a remedy).

``HostSlab``: one reused block of host memory (pinned on CUDA) handed out by a bump pointer and
reset when every piece is released, so steady-state steps allocate nothing: allocating pinned
memory per tensor costs milliseconds and synchronises (PYTORCH-NOTES.md). It grows only while
the first step runs, then consolidates into one chunk of the high-water size.

``Streams``: the compute stream captured explicitly when a module starts (under
``torch.cuda.stream(s)`` the current stream *is* ``s``, so waiting on "the current stream" from
inside our side stream would do nothing) and the side stream our copies run on. On a CPU-only
build (no CUDA: ``pin_memory`` raises, ``torch.cuda.default_stream()`` asserts) both are None
and every copy is a plain synchronous same-device copy: the same code path, so exactness is
testable there.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext
from typing import Any

import torch

from advisor.records import host_memory

ALIGN = 64  # bytes: any dtype's view of the slab starts aligned


def on_cuda(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


def host_empty(nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 host buffer (pinned when ``device`` is CUDA), registered as the advisor's."""
    if on_cuda(device):
        buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        storage = buf.untyped_storage()
        host_memory.register(storage._cdata, storage.nbytes())
    else:
        # Registered before any op sees it: under an enforced budget on CPU the memory tracker
        # would otherwise count this allocation against the device budget (a storage constructor
        # is no dispatched op; ``set_`` is, and then finds the key registered).
        storage = torch.UntypedStorage(nbytes)
        host_memory.register(storage._cdata, storage.nbytes())
        buf = torch.empty(0, dtype=torch.uint8).set_(storage)
    # A handle dropped without revert (a kept remedy at exit) must not leave its key behind: a new
    # storage at the same address would be taken for ours.
    weakref.finalize(storage, host_memory.unregister, storage._cdata).atexit = False
    return buf


def host_free(buf: torch.Tensor) -> None:
    host_memory.unregister(buf.untyped_storage()._cdata)


def dense_span(t: torch.Tensor) -> bool:
    """True when ``t``'s elements tile its storage span exactly (no gaps, no overlap): then a
    copy with the same strides fits ``numel`` elements and keeps the layout bit for bit."""
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
    return t.numel() > 0 and all(st > 0 or s <= 1 for s, st in zip(t.shape, t.stride())) and span == t.numel()


class HostSlab:
    """Reused host memory for one applier (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.chunks: list[torch.Tensor] = []
        self.chunk = 0
        self.offset = 0
        self.high_water = 0
        self.used = 0

    def take(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of the slab as uint8 (valid until ``reset``)."""
        size = -(-nbytes // ALIGN) * ALIGN
        while self.chunk < len(self.chunks) and self.offset + size > self.chunks[self.chunk].numel():
            self.chunk, self.offset = self.chunk + 1, 0
        if self.chunk == len(self.chunks):  # first step only: grow by a chunk at least as large as all so far
            self.chunks.append(host_empty(max(size, self.used), self.device))
            self.offset = 0
        piece = self.chunks[self.chunk][self.offset:self.offset + nbytes]
        self.offset += size
        self.used += size
        self.high_water = max(self.high_water, self.used)
        return piece

    def reset(self) -> None:
        """Everything handed out is released: reuse from the start, in one chunk from now on."""
        if len(self.chunks) > 1:
            # Dropped, not unregistered: each chunk's finalizer (``host_empty``) unregisters it as
            # its storage is freed. Unregistered while still referenced, the chunks were counted
            # as device bytes beside the new slab: a phantom peak on the first offloaded step.
            self.chunks = []
            self.chunks = [host_empty(self.high_water, self.device)]
        self.chunk = self.offset = self.used = 0

    def free(self) -> None:
        for buf in self.chunks:
            host_free(buf)
        self.chunks = []
        self.chunk = self.offset = self.used = 0

    @property
    def nbytes(self) -> int:
        return sum(c.numel() for c in self.chunks)


class Streams:
    """The captured compute stream and our side stream (None, None off CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side: Any = torch.cuda.Stream(device=device) if on_cuda(device) else None
        self.compute: Any = None

    def capture(self) -> None:
        """Remember the stream the module computes on (called outside our side stream)."""
        if self.side is not None:
            self.compute = torch.cuda.current_stream(self.device)

    def on_side(self) -> Any:
        return torch.cuda.stream(self.side) if self.side is not None else nullcontext()

    def side_waits_compute(self) -> None:
        if self.side is not None:
            self.side.wait_stream(self.compute or torch.cuda.current_stream(self.device))

    def compute_waits(self, event: Any) -> None:
        if event is not None:
            (self.compute or torch.cuda.current_stream(self.device)).wait_event(event)

    def record(self) -> Any:
        """An event on the side stream after the copies queued so far (None off CUDA)."""
        if self.side is None:
            return None
        event = torch.cuda.Event()
        event.record(self.side)
        return event


def view_as(piece: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``piece`` (uint8, ``like.nbytes`` long) as a tensor with ``like``'s dtype, shape and strides."""
    return piece.view(like.dtype).as_strided(like.shape, like.stride())


def no_accelerator(target: Any) -> dict[str, str]:
    """The offload checks' refusal on a CPU-only job (``host_memory.NO_ACCELERATOR``)."""
    return {"": host_memory.NO_ACCELERATOR} if target.device.type == "cpu" else {}
