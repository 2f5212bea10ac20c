"""The fake world a fit runs the script in, entered around the script and left after it.

In order: ``torch.cuda`` answers for the target (``cuda_api``), fake tensors say where they are
(``tensors``), CUDA autocast is mirrored on the CPU's (``autocast``), modules move by setting their
parameters' data (``modules``), a process group of the target's world size is PyTorch's fake one
and DDP runs on it (``distributed``), loaded weights are read as shapes (``weights``), batches are
loaded for real outside the fake mode, ``torch.compile`` leaves models eager, the script's file
writes go to the session folder (``writes``), and then the fake mode and the device calls' mode are
entered. Everything is put back on the way out, last first. A process forked from inside (a
DataLoader worker) leaves the fake modes, so that its batches are real tensors.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from advisor.fit.autocast import mirror_autocast
from advisor.fit.cuda_api import install_cuda
from advisor.fit.distributed import install_world
from advisor.fit.functions import DeviceCalls
from advisor.fit.modules import install_module_moves
from advisor.fit.patches import Patches
from advisor.fit.reads import Reads, install_array_reads
from advisor.fit.tensors import FitTensorMode, install_device_view, install_formatting
from advisor.fit.weights import Weights
from advisor.fit.writes import Shadow, install_writes
from advisor.records.fit import FitSettings

_ACTIVE: list["FitWorld"] = []


def _leave_in_child() -> None:
    """After a fork (a DataLoader worker): no fake mode, no device calls' mode, in the child."""
    if not _ACTIVE:
        return
    torch._C._unset_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    while torch._C._len_torch_function_stack():
        torch._C._pop_torch_function_stack()
    _ACTIVE.clear()


os.register_at_fork(after_in_child=_leave_in_child)


class FitWorld:
    """The script's view of the target (see the module docstring). ``tracked()``: the device bytes
    the memory tracker counts now, for ``torch.cuda.memory_allocated``."""

    def __init__(self, settings: FitSettings, reads: Reads, *, tracked: Callable[[], int] = lambda: 0,
                 shadow: Shadow | None = None) -> None:
        self.settings = settings
        self.shadow = shadow
        self.reads = reads
        target = settings.device
        self.mode = FitTensorMode(target="cuda" if target is not None else None, on_unrunnable=reads.unrunnable)
        reads.counted = self.mode.sparsity.values
        self.mode.step_of = reads.steps_done
        self.calls = DeviceCalls(self.mode, index=0)
        self._tracked = tracked
        self._patches = Patches()

    def __enter__(self) -> "FitWorld":
        patches = self._patches
        target = self.settings.device
        try:
            if target is not None:
                install_cuda(patches, target, device_count=self.settings.nproc_per_node, tracked=self._tracked)
                install_device_view(patches)
                mirror_autocast(patches)
                _foreach_on_device(patches)
            install_formatting(patches)
            install_array_reads(patches, self.reads)
            _no_distribution_checks(patches)
            install_module_moves(patches)
            install_world(patches, self.settings)
            Weights(self.mode).install(patches)
            _real_batches(patches)
            _eager_compile(patches)
            if self.shadow is not None:
                install_writes(patches, self.shadow)
            self.mode.__enter__()
            self.calls.__enter__()
        except BaseException:
            patches.restore()
            raise
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        try:
            self.calls.__exit__(*exc)
            self.mode.__exit__(*exc)
        finally:
            self._patches.restore()


def _no_distribution_checks(patches: Patches) -> None:
    """``torch.distributions`` checks that arguments and samples lie in their supports by reading
    values (``support.check(value).all()``): on fake tensors each check read a placeholder and
    raised (the zoo's mixture of experts, ``Normal.cdf`` in its gating, before its first step).
    The checks only refuse invalid values; under a fit there are none to check."""
    from torch.distributions import Distribution

    patches.set(Distribution, "_validate_args", False)


def _foreach_on_device(patches: Patches) -> None:
    """Optimizers pick their foreach (multi-tensor) implementation by the parameters' type and
    device: on CUDA they take it, and its temporaries, for plain parameters; a fit's parameters
    are ``FakeTensor``s, which the check does not know."""
    import torch.optim.optimizer as optimizer

    types = list(optimizer._foreach_supported_types)
    patches.set(optimizer, "_foreach_supported_types", [*types, FakeTensor])


def _eager_compile(patches: Patches) -> None:
    """``torch.compile`` and ``module.compile()`` leave the model as it is: dynamo cannot trace the
    fit's fake tensors as it traces real ones, so a compiled model is planned as it runs eagerly
    (a compiled graph may save less for backward than eager ops do)."""

    def compile(model: Any = None, **options: Any) -> Any:
        return model if model is not None else (lambda fn: fn)

    patches.set(torch, "compile", compile)
    patches.set(torch.nn.Module, "compile", lambda self, *args, **kwargs: None)


def _real_batches(patches: Patches) -> None:
    """A DataLoader's batch is made for real, outside the fake world: data loading reads files and
    decodes them as under python; the batch becomes fake when it meets the model or moves to the
    device."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original = _BaseDataLoaderIter.__next__

    def __next__(self: Any) -> Any:
        with unset_fake_temporarily(), torch._C.DisableTorchFunction():
            return original(self)

    patches.set(_BaseDataLoaderIter, "__next__", __next__)
