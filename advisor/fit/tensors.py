"""Fake tensors that live on the CPU inside and say they are on the target device.

``FakeTensorMode`` can make fake CUDA tensors on a CPU-only build, but autograd cannot take them
there: recording a CUDA tensor's gradient edge asks the CUDA device guard for its stream, which a
CPU-only build does not have, and the process aborts (torch 2.13; ``_ensureCUDADeviceGuardSet``
installs a no-op guard only in a CUDA build without devices, and the backward engine then asks
for an accelerator all the same). So every fake tensor of a fit is a CPU fake tensor to PyTorch's
C++ code, and its place, the host or the target device, is kept beside it, per storage: views and
in-place results share their base's place, ``param.data = t`` takes ``t``'s, and a storage's place
goes when the storage does. ``FitTensorMode.place_of`` answers it; ``install_device_view`` makes
``tensor.device``, ``is_cuda``, ``is_cpu`` and ``get_device()`` answer with it in the script's
code (FakeTensorMode's own code still sees the CPU: it picks a kernel's device from them).

A new storage takes the place of the op's inputs: the target device when any input is there, the
host when every input is on the host (a tensor made outside the fake mode, real data from the
loader, is on the host), and the target device for an op without tensor inputs, which only C++
issues (a backward formula's zeros, DDP's gradient buckets); a factory the script calls is placed
by ``advisor.fit.functions`` from its ``device`` argument.

What the C++ code cannot be told: a kernel meant for CUDA (CUDA autocast's casts, the flash
attention kernel) runs as its CPU counterpart would; ``advisor.fit.autocast`` applies CUDA's
autocast policy in Python instead. Ops that mix the host and the device are not refused as CUDA
would refuse them.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._pytree import tree_flatten

from advisor.fit.draws import Draws, draws
from advisor.fit.patches import Patches
from advisor.fit.sparsity import Sparsity
from advisor.fit.workspaces import (
    OUTPUT_STORAGE_PROBED,
    WORKSPACE_OUTPUT,
    with_real_output_storage,
    with_real_workspace,
)

HOST: None = None  # the place of a host tensor; a device tensor's place is its device index

# What an op that cannot run on fake tensors raises: a value read (``.item()``), an output shape
# that depends on values (``nonzero``), a kernel without a fake implementation (a custom op).
UNRUNNABLE = (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException)

Unrunnable = Callable[[Any, Exception, tuple[Any, ...]], Any]


class FitTensorMode(FakeTensorMode):
    """A ``FakeTensorMode`` whose tensors have a place: the host or the target device.

    ``target``: the device type the script's ``"cuda"`` means (None: the target is the CPU, and
    every tensor is where PyTorch says). ``on_unrunnable(func, exc, args)`` is called when an op
    cannot run on fake tensors; what it returns is the op's result (a placeholder for a value
    read), or it raises.
    """

    def __init__(self, *, target: str | None, on_unrunnable: Unrunnable) -> None:
        super().__init__(allow_non_fake_inputs=True)
        self.target = target
        self._on_unrunnable = on_unrunnable
        self._places: dict[int, int | None] = {}  # storage key -> device index, or HOST
        self.depth = 0  # > 0 while FakeTensorMode's own code runs an op (it must see the CPU)
        self.draws = Draws()  # random ops replayed on the host's generator (advisor.fit.draws)
        self.sparsity = Sparsity()  # nonzero counts: the shapes of value-shaped ops (advisor.fit.sparsity)
        # The script's ops per optimizer step (``step_of``: the steps done), for the share of a
        # step that ran before an op stopped the fit (``FitRun``).
        self.step_of: Callable[[], int] = lambda: 0
        self.ops_by_step: dict[int, int] = {}

    # -- places ---------------------------------------------------------------------------
    def place_of(self, tensor: torch.Tensor) -> int | None:
        """The device index a tensor is on, or HOST. A tensor this mode did not make (real data,
        a fake made from it) is on the host."""
        if self.target is None or not isinstance(tensor, FakeTensor):
            return HOST
        try:
            key = tensor.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):
            return HOST
        return self._places.get(key, HOST)

    def place(self, tensor: torch.Tensor, place: int | None) -> None:
        """Put ``tensor`` (its storage, so every view of it) on ``place``."""
        if self.target is None or not isinstance(tensor, FakeTensor):
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self._places:
            finalizer = weakref.finalize(storage, self._places.pop, key, None)
            finalizer.atexit = False
        self._places[key] = place

    def place_all(self, value: Any, place: int | None) -> None:
        for tensor in tree_flatten(value)[0]:
            if isinstance(tensor, torch.Tensor):
                self.place(tensor, place)

    def device_of(self, tensor: FakeTensor) -> torch.device:
        place = self.place_of(tensor)
        if place is HOST or self.target is None:
            return tensor.fake_device
        return torch.device(self.target, place)

    # -- every op ---------------------------------------------------------------------------
    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        named: int | None = None  # the device index a factory names (``device=`` at dispatch)
        device = kwargs.get("device")
        if self.target is not None and isinstance(device, torch.device) and device.type == self.target:
            named = device.index or 0
            kwargs = {**kwargs, "device": torch.device("cpu")}
        outer = self.depth == 0  # not an op FakeTensorMode runs inside another (a decomposition)
        if outer:
            step = self.step_of()
            self.ops_by_step[step] = self.ops_by_step.get(step, 0) + 1
        if named is None and _all_real(args, kwargs):
            # Only real tensors in: the script's host data (made for real by ``advisor.fit.functions``
            # or a DataLoader), computed for real, as under python (FakeTensorMode would fake it).
            return func(*args, **kwargs)
        self.depth += 1
        try:
            out = super().dispatch(func, types, args, kwargs)
        except UNRUNNABLE as exc:
            out = None
            failed: Exception | None = exc
        else:
            failed = None
        finally:
            self.depth -= 1
        if failed is not None:
            sized = self.sparsity.shaped(func, args)
            if sized is None:
                return self._on_unrunnable(func, failed, args)
            out = self._empty(types, *sized)
        if self.target is None and func in WORKSPACE_OUTPUT and not kwargs:
            out = with_real_workspace(func, args, out)
        if self.target is None and func in OUTPUT_STORAGE_PROBED and outer:
            out = with_real_output_storage(func, args, kwargs, out)
        if named is not None:
            self.place_all(out, named)
        elif self.target is not None:
            self._place_outputs(args, kwargs, out)
        if outer and draws(func) and named is None and self._on_host(out):
            self.draws.replay(func, args, kwargs, out)
        self.sparsity.after(func, args, kwargs, out)
        return out

    def _empty(self, types: Any, shape: tuple[int, ...], dtype: torch.dtype) -> Any:
        """A fake tensor of ``shape``: the output of a value-shaped op that ``Sparsity`` sized."""
        self.depth += 1
        try:
            return super().dispatch(torch.ops.aten.empty.memory_format, types, (list(shape),),
                                    {"dtype": dtype, "device": torch.device("cpu")})
        finally:
            self.depth -= 1

    def _on_host(self, out: Any) -> bool:
        """Whether the op's outputs are where a real run draws from the host's generator."""
        return all(self.place_of(t) is HOST for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))

    def _place_outputs(self, args: Any, kwargs: Any, out: Any) -> None:
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        place: int | None = 0  # no tensor input: C++ made it for the job's device
        if inputs:
            places = [self.place_of(t) for t in inputs]
            place = next((p for p in places if p is not HOST), HOST)
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, FakeTensor):
                continue
            try:
                key = tensor.untyped_storage()._cdata
            except (RuntimeError, NotImplementedError):
                continue
            if key not in self._places:  # a view or an in-place result keeps its base's place
                self.place(tensor, place)


def _all_real(args: Any, kwargs: Any) -> bool:
    """Whether an op has tensor inputs and none of them is fake."""
    found = False
    for value in tree_flatten((args, kwargs))[0]:
        if isinstance(value, FakeTensor):
            return False
        found = found or isinstance(value, torch.Tensor)
    return found


def install_formatting(patches: Patches) -> None:
    """``f"{loss:.6f}"`` on a fake tensor reads its value, as on a real one: ``Tensor.__format__``
    reads a 0-dim tensor through ``item()`` only when its type is exactly ``Tensor``, so a fake
    one raised "unsupported format string passed to FakeTensor.__format__" and the fit of llmc's
    trainer stopped in step 1 at its log line, before the step the memory probe tracks ended. Here
    the read goes through ``item()``, which the fit answers with a placeholder (``advisor.fit.reads``),
    counted by line like any other read."""
    original = FakeTensor.__format__

    def format_(self: FakeTensor, spec: str) -> str:
        if spec and self.dim() == 0:
            return format(self.item(), spec)
        return original(self, spec)

    patches.set(FakeTensor, "__format__", format_)


def install_device_view(patches: Patches) -> None:
    """Make a fit's fake tensors say where they are in the script's code (see the module docstring):
    ``device``, ``is_cuda``, ``is_cpu`` and ``get_device()`` on ``FakeTensor``, restored by ``patches``."""
    original = FakeTensor.__dict__["device"]

    def device(self: FakeTensor) -> torch.device:
        mode = self.fake_mode
        if isinstance(mode, FitTensorMode) and not mode.in_kernel_invocation and not mode.depth:
            return mode.device_of(self)
        return original.__get__(self)

    patches.set(FakeTensor, "device", property(device))
    patches.set(FakeTensor, "is_cuda", property(lambda self: self.device.type == "cuda"))
    patches.set(FakeTensor, "is_cpu", property(lambda self: self.device.type == "cpu"))

    def get_device(self: FakeTensor) -> int:
        where = self.device
        return -1 if where.type == "cpu" else (where.index or 0)

    patches.set(FakeTensor, "get_device", get_device)

    # A DTensor (FSDP2's parameters, their gradients and state) is a wrapper made with its local
    # tensor's C++ device: it says where its local shard is.
    from torch.distributed.tensor import DTensor

    wrapper = DTensor.device  # inherited from the C++ tensor

    def dtensor_device(self: Any) -> torch.device:
        local = getattr(self, "_local_tensor", None)
        return local.device if isinstance(local, FakeTensor) else wrapper.__get__(self)

    patches.set(DTensor, "device", property(dtensor_device))
    patches.set(DTensor, "is_cuda", property(lambda self: self.device.type == "cuda"))
