"""Weights the script loads from files, read as shapes and dtypes, not as values where possible.

A fit may plan a model larger than this machine's memory, so a checkpoint's tensors become fake
tensors of their shapes without their bytes being read:

- safetensors files: only the header (8 bytes of length, then JSON: each tensor's dtype, shape
  and offsets) is read, by ``safetensors.safe_open`` and ``safetensors.torch.load_file`` alike;
- ``torch.load``: the file is memory-mapped (``mmap=True``, the zip format PyTorch saves by
  default) outside the fake mode, so the pages of a tensor are never touched, and each tensor is
  turned into a fake one of its shape. A legacy (non-zip) file is read whole, as PyTorch reads it.

A ``map_location`` or ``device`` naming the target device places the tensors there; anything
else leaves them on the host.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._pytree import tree_map

from advisor.fit.patches import Patches
from advisor.fit.tensors import HOST, FitTensorMode

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
MAX_HEADER = 100 * 2**20  # safetensors' own limit on a header


def read_safetensors_header(path: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(tensor name -> {"dtype", "shape"}, the file's metadata) from a safetensors file's header."""
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER:
            raise ValueError(f"{path}: safetensors header of {length} bytes is over the {MAX_HEADER}-byte limit")
        header = json.loads(handle.read(length))
    metadata = header.pop("__metadata__", None) or {}
    return header, metadata


class _FakeSafeOpen:
    """``safetensors.safe_open`` over the header alone: tensors come out fake."""

    def __init__(self, weights: "Weights", path: str, device: Any) -> None:
        self._weights = weights
        self._header, self._metadata = read_safetensors_header(str(path))
        self._device = device

    def __enter__(self) -> "_FakeSafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def keys(self) -> list[str]:
        return sorted(self._header)

    def metadata(self) -> dict[str, str]:
        return dict(self._metadata)

    def get_tensor(self, name: str) -> torch.Tensor:
        entry = self._header[name]
        return self._weights.fake(tuple(entry["shape"]), SAFETENSORS_DTYPES[entry["dtype"]], self._device)

    def get_slice(self, name: str) -> torch.Tensor:
        return self.get_tensor(name)


class Weights:
    """Makes the fake tensors of loaded weights (see the module docstring)."""

    def __init__(self, mode: FitTensorMode, *, index: int = 0) -> None:
        self.mode = mode
        self.index = index

    def fake(self, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
        with torch._C.DisableTorchFunction(), self.mode:  # a fake factory, whatever the device calls' mode says
            tensor = torch.empty(shape, dtype=dtype)
        self.mode.place(tensor, self._place(device))
        return tensor

    def _place(self, device: Any) -> int | None:
        if self.mode.target is None or device is None:
            return HOST
        where = torch.device(device) if not isinstance(device, int) else torch.device(self.mode.target, device)
        if where.type == self.mode.target:
            return where.index if where.index is not None else self.index
        return HOST

    def from_real(self, value: Any, device: Any) -> Any:
        place = self._place(device)

        def convert(item: Any) -> Any:
            if isinstance(item, torch.Tensor) and not isinstance(item, torch._subclasses.FakeTensor):
                fake = self.mode.from_tensor(item)
                self.mode.place(fake, place)
                return fake
            return item

        return tree_map(convert, value)

    def install(self, patches: Patches) -> None:
        original_load = torch.load

        def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
            device = map_location if isinstance(map_location, (str, int, torch.device)) else None
            with unset_fake_temporarily(), torch._C.DisableTorchFunction():
                try:
                    loaded = original_load(f, *args, map_location="cpu", **{"mmap": True, **kwargs})
                except RuntimeError:  # not the zip format: read as PyTorch reads it
                    if hasattr(f, "seek"):
                        f.seek(0)
                    loaded = original_load(f, *args, map_location="cpu", **kwargs)
            return self.from_real(loaded, device)

        patches.set(torch, "load", load)
        try:
            import safetensors
            import safetensors.torch
        except ImportError:
            return

        def safe_open(filename: Any, framework: str = "pt", device: Any = "cpu") -> _FakeSafeOpen:
            return _FakeSafeOpen(self, str(filename), device)

        def load_file(filename: Any, device: Any = "cpu") -> dict[str, torch.Tensor]:
            with safe_open(filename, device=device) as handle:
                return {name: handle.get_tensor(name) for name in handle.keys()}

        patches.set(safetensors, "safe_open", safe_open)
        patches.set(safetensors.torch, "safe_open", safe_open)
        patches.set(safetensors.torch, "load_file", load_file)
