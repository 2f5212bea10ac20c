"""Forked children of a profiled process exit as under python (issue 30 item 6).

Once a ``torch.profiler`` session has run, kineto's config loader keeps a thread waiting on a
condition variable. A child made by ``os.fork()`` inherits the variable with that waiter but not
the thread, and hangs for ever at exit in the loader's destructor (``pthread_cond_destroy``; plain
PyTorch does the same after a profiler session, then a fork: PYTORCH-NOTES.md). A script that never
profiles must not inherit that hazard from the probes: around every fork the loader's thread is
stopped (the child has none to wait for) and started again in the parent.

The loader's ``instance``, ``stopThread`` and ``startThread`` are exported from ``libtorch_cpu``
(torch 2.11 and 2.13, x86-64 Linux); where they are not, nothing is installed. Remove this when
kineto's loader is fork-safe.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable

import torch

_INSTANCE = "_ZN9libkineto12ConfigLoader8instanceEv"
_STOP = "_ZN9libkineto12ConfigLoader10stopThreadEv"
_START = "_ZN9libkineto12ConfigLoader11startThreadEv"

_installed = False


def guard_forks() -> bool:
    """Install the fork handlers once (call it after a profiler session has started); whether
    they are in place."""
    global _installed
    if _installed:
        return True
    found = _loader_calls()
    if found is None or not hasattr(os, "register_at_fork"):
        return False
    stop, start = found
    os.register_at_fork(before=stop, after_in_parent=start)
    _installed = True
    return True


def _loader_calls() -> tuple[Callable[[], None], Callable[[], None]] | None:
    """(stop, start) of kineto's config loader thread, or None where the library lacks them."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_GLOBAL)
        instance, stop, start = getattr(lib, _INSTANCE), getattr(lib, _STOP), getattr(lib, _START)
    except (OSError, AttributeError):
        return None
    instance.restype, instance.argtypes = ctypes.c_void_p, []
    for fn in (stop, start):
        fn.restype, fn.argtypes = None, [ctypes.c_void_p]
    return (lambda: stop(instance())), (lambda: start(instance()))
