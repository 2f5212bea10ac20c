"""The script's file writes under a fit go to the session folder, never over the user's files.

A fit runs the script on fake tensors: what it writes (a checkpoint of fake weights, an image of
placeholder pixels, a log of placeholder losses) is not what a real run would write, and writing
it over the user's files loses theirs (``torch.save`` of a fake state dict replaced a real
checkpoint with 689 bytes). So for the length of the fit, in the training process (and the
DataLoader workers it forks), every file the script opens for writing, appending or updating is
opened at the same path under ``<session>/writes/`` instead, its folders made there; a later open
for reading of a path written so is opened there too, so a script that writes and reads back (a
cache it prepares, ``np.memmap`` of a file it just wrote) runs as under python. Folders made
(``os.makedirs``, ``os.mkdir``) are made there; removals and renames act there, and on a path
only the user's tree has they do nothing. Every path redirected is counted and named in the report.

What goes through Python's ``open`` (``builtins.open``, ``io.open``, ``Path.open`` and its
``write_*``, ``torch.save``, numpy, PIL, ``logging.FileHandler``s made during the fit) and
``os.open`` is covered; a C++ or Rust writer is given the redirected path where its Python
wrapper takes one (``torch.save``'s zip writer, safetensors' ``save_file``), else it writes where
the script said. ``torch.save`` writes fake tensors as PyTorch's ``skip_data`` does (shapes and
dtypes, no bytes), so a checkpoint saved in the loop does not stop the fit. Not redirected: the session folder, ``$ADVISOR_HOME``, ``/dev``,
``/proc`` and ``/sys``.
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable

from advisor.fit.patches import Patches

FOLDER = "writes"
_WRITE_MODES = frozenset("wax+")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class Shadow:
    """Paths of the user's tree, mapped under ``root`` (``<session>/writes``)."""

    def __init__(self, root: Path, keep: tuple[Path, ...]) -> None:
        self.root = root.resolve()
        self.keep = tuple(str(p.resolve()) for p in (*keep, self.root)) + ("/dev", "/proc", "/sys")
        self.written: dict[str, int] = {}  # user path -> times redirected
        self._lock = threading.Lock()

    def _absolute(self, path: Any) -> str | None:
        if isinstance(path, int):
            return None  # a file descriptor: already open
        try:
            text = os.fsdecode(os.fspath(path))
        except TypeError:
            return None
        return os.path.abspath(text)

    def _kept(self, absolute: str) -> bool:
        return any(absolute == k or absolute.startswith(k.rstrip("/") + "/") for k in self.keep)

    def mapped(self, path: Any) -> str | None:
        """Where ``path`` lives under the shadow, or None when it is not redirected."""
        absolute = self._absolute(path)
        if absolute is None or self._kept(absolute):
            return None
        return os.path.join(self.root, absolute.lstrip("/"))

    def for_write(self, path: Any) -> Any:
        """The path to write instead of ``path`` (its folder made under the shadow), counted."""
        target = self.mapped(path)
        if target is None:
            return path
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with self._lock:
            key = self._absolute(path) or ""
            self.written[key] = self.written.get(key, 0) + 1
        return target

    def for_read(self, path: Any) -> Any:
        """``path``'s shadow copy when the fit wrote one, else ``path``."""
        target = self.mapped(path)
        return target if target is not None and os.path.lexists(target) else path

    def redirected(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"path": p, "count": n} for p, n in sorted(self.written.items())]


def _writes(mode: Any) -> bool:
    return isinstance(mode, str) and bool(_WRITE_MODES & set(mode))


def install_writes(patches: Patches, shadow: Shadow) -> None:
    original_open = builtins.open
    original_os_open = os.open

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        target = shadow.for_write(file) if _writes(mode) else shadow.for_read(file)
        return original_open(target, mode, *args, **kwargs)

    def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        target = shadow.for_write(path) if flags & _WRITE_FLAGS else shadow.for_read(path)
        return original_os_open(target, flags, *args, **kwargs)

    patches.set(builtins, "open", open_)
    patches.set(io, "open", open_)
    patches.set(os, "open", os_open)
    _made_there(patches, shadow)
    _moved_there(patches, shadow)
    _safetensors(patches, shadow)
    _torch_save(patches, shadow)


def _torch_save(patches: Patches, shadow: Shadow) -> None:
    """``torch.save`` to a file name writes from C++ (``PyTorchFileWriter``): given the redirected name."""
    import torch
    import torch.serialization as serialization

    original = serialization.save
    skip_data = getattr(serialization, "skip_data", None)

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, (str, bytes, os.PathLike)):
            f = shadow.for_write(f)
        if skip_data is None:
            return original(obj, f, *args, **kwargs)
        # Fake tensors have no data to write (pickling one fails on its mode's weak references):
        # their shapes and dtypes are written, the bytes left empty, as PyTorch's own skip_data does.
        with skip_data(materialize_fake_tensors=True):
            return original(obj, f, *args, **kwargs)

    patches.set(serialization, "save", save)
    patches.set(torch, "save", save)


def _made_there(patches: Patches, shadow: Shadow) -> None:
    for name in ("makedirs", "mkdir"):
        original = getattr(os, name)

        def made(path: Any, *args: Any, _original: Callable = original, **kwargs: Any) -> Any:
            target = shadow.mapped(path)
            if target is None:
                return _original(path, *args, **kwargs)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            return _original(target, *args, **kwargs)

        patches.set(os, name, made)


def _moved_there(patches: Patches, shadow: Shadow) -> None:
    """Removals and renames act on the shadow; on a path only the user's tree has, nothing."""
    for name in ("remove", "unlink"):
        original = getattr(os, name)

        def removed(path: Any, *args: Any, _original: Callable = original, **kwargs: Any) -> None:
            target = shadow.mapped(path)
            if target is None:
                return _original(path, *args, **kwargs)
            if os.path.lexists(target):
                _original(target, *args, **kwargs)
            return None

        patches.set(os, name, removed)
    for name in ("rename", "replace"):
        original = getattr(os, name)

        def moved(src: Any, dst: Any, *args: Any, _original: Callable = original, **kwargs: Any) -> None:
            source, target = shadow.mapped(src), shadow.mapped(dst)
            if source is None and target is None:
                return _original(src, dst, *args, **kwargs)
            real_source = shadow.for_read(src)
            if real_source is src or target is None:
                return None  # the user's own file, or a move into kept folders of a fit's file: left
            return _original(real_source, shadow.for_write(dst), *args, **kwargs)

        patches.set(os, name, moved)
    original_rmtree = shutil.rmtree

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        target = shadow.mapped(path)
        if target is None:
            return original_rmtree(path, *args, **kwargs)
        if os.path.isdir(target):
            original_rmtree(target, *args, **kwargs)
        return None

    patches.set(shutil, "rmtree", rmtree)


def _safetensors(patches: Patches, shadow: Shadow) -> None:
    """safetensors writes from Rust: its Python wrappers are given the redirected file name."""
    import importlib
    import sys

    for module_name in ("safetensors.torch", "safetensors.numpy"):
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = importlib.import_module(module_name)
            except Exception:  # noqa: BLE001 - not installed, or its framework is not
                continue
        original = getattr(module, "save_file", None)
        if original is None:
            continue

        def save_file(tensors: Any, filename: Any, *args: Any, _original: Callable = original, **kwargs: Any) -> Any:
            return _original(tensors, shadow.for_write(filename), *args, **kwargs)

        patches.set(module, "save_file", save_file)
