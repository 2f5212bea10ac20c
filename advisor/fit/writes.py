"""Under a fit, the script's writes never change or remove a file the user had.

A fit runs the script on fake tensors: what it writes from them (a checkpoint of fake weights, a
log of placeholder losses) is not what a real run writes, and written over the user's files it
loses theirs (``torch.save`` of a fake state dict replaced a real checkpoint with 689 bytes). So
for the length of the fit, in the training process (and the DataLoader workers it forks):

- a file that existed before the fit began (modified earlier) is never written, removed or
  replaced: a write to it goes to the same path under ``<session>/writes/`` (copied there first
  when opened to append or update), and later reads of that path read the copy, so the script
  sees what it wrote;
- ``torch.save`` (and safetensors' ``save_file``), the writes of model state, always go there,
  since what they write is fake: a fake checkpoint left where a real run resumes from would be
  loaded as weights;
- anything else is written where the script says: a new log, a cache of the script's real host
  data, a library's own files and folders (Hugging Face datasets builds its cache in a temporary
  folder it then renames, and checks that the result exists: an overlay that moved those away
  broke it). Those files are listed in the report too.

Covered: what goes through Python's ``open`` (``builtins.open``, ``io.open``, ``Path.open`` and its
``write_*``, numpy, PIL, ``logging.FileHandler``s made during the fit), ``os.open``, ``os.remove``,
``os.unlink``, ``os.rename``, ``os.replace``, ``shutil.rmtree``, and the C++ and Rust writers whose
Python wrappers take a file name (``torch.save``'s zip writer, safetensors). A C library writing
by itself over a user's file is not. ``torch.save`` writes fake tensors as PyTorch's ``skip_data``
does (shapes and dtypes, no bytes), so a checkpoint saved in the loop does not stop the fit. Not
redirected: the session folder, ``$ADVISOR_HOME``, ``/dev``, ``/proc`` and ``/sys``.
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from advisor.fit.patches import Patches

FOLDER = "writes"
_WRITE_MODES = frozenset("wax+")
_KEEPS_CONTENT = frozenset("a+")  # modes whose write starts from the file's content
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class Shadow:
    """The user's files as they were when the fit began, and the copies written instead of them."""

    def __init__(self, root: Path, keep: tuple[Path, ...]) -> None:
        self.root = root.resolve()
        self.keep = tuple(str(p.resolve()) for p in (*keep, self.root)) + ("/dev", "/proc", "/sys")
        self.started = time.time()
        self._redirected: dict[str, int] = {}  # user path -> writes that went to its copy
        self._created: dict[str, int] = {}  # path -> writes made where the script said
        self._lock = threading.Lock()

    def _absolute(self, path: Any) -> str | None:
        if isinstance(path, int):
            return None  # a file descriptor: already open
        try:
            return os.path.abspath(os.fsdecode(os.fspath(path)))
        except TypeError:
            return None

    def mapped(self, path: Any) -> str | None:
        """Where ``path``'s copy lives, or None for a path never redirected (the kept folders)."""
        absolute = self._absolute(path)
        if absolute is None or any(absolute == k or absolute.startswith(k.rstrip("/") + "/") for k in self.keep):
            return None
        return os.path.join(self.root, absolute.lstrip("/"))

    def users(self, path: Any) -> bool:
        """Whether ``path`` is a file the user had before the fit began."""
        try:
            return os.lstat(path).st_mtime < self.started
        except (OSError, TypeError, ValueError):
            return False

    def for_write(self, path: Any, mode: str = "w", *, always: bool = False) -> Any:
        """The path to write instead of ``path``: its copy for a user's file (or always), else itself."""
        copy = self.mapped(path)
        if copy is None:
            return path
        key = self._absolute(path) or ""
        if always or os.path.lexists(copy) or self.users(path):
            os.makedirs(os.path.dirname(copy), exist_ok=True)
            if not os.path.lexists(copy) and _KEEPS_CONTENT & set(mode) and os.path.isfile(path):
                shutil.copyfile(path, copy)  # appending to the user's file: to a copy of it
            self._count(self._redirected, key)
            return copy
        self._count(self._created, key)
        return path

    def for_read(self, path: Any) -> Any:
        """``path``'s copy when the fit wrote one, else ``path``."""
        copy = self.mapped(path)
        return copy if copy is not None and os.path.lexists(copy) else path

    def _count(self, counts: dict[str, int], key: str) -> None:
        with self._lock:
            counts[key] = counts.get(key, 0) + 1

    def redirected(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"path": p, "count": n} for p, n in sorted(self._redirected.items())]

    def created(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"path": p, "count": n} for p, n in sorted(self._created.items()) if p not in self._redirected]


def _mode_writes(mode: Any) -> bool:
    return isinstance(mode, str) and bool(_WRITE_MODES & set(mode))


def install_writes(patches: Patches, shadow: Shadow) -> None:
    original_open = builtins.open
    original_os_open = os.open

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        target = shadow.for_write(file, mode) if _mode_writes(mode) else shadow.for_read(file)
        return original_open(target, mode, *args, **kwargs)

    def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & _WRITE_FLAGS:
            target = shadow.for_write(path, "w" if flags & os.O_TRUNC else "a")
        else:
            target = shadow.for_read(path)
        return original_os_open(target, flags, *args, **kwargs)

    patches.set(builtins, "open", open_)
    patches.set(io, "open", open_)
    patches.set(os, "open", os_open)
    _removals(patches, shadow)
    _renames(patches, shadow)
    _model_state_writers(patches, shadow)


def _removals(patches: Patches, shadow: Shadow) -> None:
    """A removal takes the fit's copy, and the file itself unless the user had it."""
    for name in ("remove", "unlink"):
        original = getattr(os, name)

        def removed(path: Any, *args: Any, _original: Callable = original, **kwargs: Any) -> None:
            copy = shadow.mapped(path)
            if copy is None:
                return _original(path, *args, **kwargs)
            had_copy = os.path.lexists(copy)
            if had_copy:
                _original(copy, *args, **kwargs)
            if shadow.users(path) or (had_copy and not os.path.lexists(path)):
                return None  # the user's file stays
            return _original(path, *args, **kwargs)

        patches.set(os, name, removed)
    original_rmtree = shutil.rmtree

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        copy = shadow.mapped(path)
        if copy is None:
            return original_rmtree(path, *args, **kwargs)
        if os.path.isdir(copy):
            original_rmtree(copy, *args, **kwargs)
        if os.path.isdir(path) and not _holds_users(shadow, path):
            return original_rmtree(path, *args, **kwargs)
        return None  # a folder with a file the user had: left whole

    patches.set(shutil, "rmtree", rmtree)


def _holds_users(shadow: Shadow, folder: Any) -> bool:
    for root, _, files in os.walk(folder):
        if any(shadow.users(os.path.join(root, f)) for f in files):
            return True
    return False


def _renames(patches: Patches, shadow: Shadow) -> None:
    """A rename moves the fit's copy between copies; it never moves a file of the user's, nor puts
    anything over one (their copies take it); otherwise it moves as under python."""
    for name in ("rename", "replace"):
        original = getattr(os, name)

        def moved(src: Any, dst: Any, *args: Any, _original: Callable = original, **kwargs: Any) -> None:
            source, target = shadow.mapped(src), shadow.mapped(dst)
            if source is None or target is None:
                return _original(src, dst, *args, **kwargs)
            if os.path.lexists(source) or shadow.users(src):  # the fit's copy, or the user's own file
                copy = shadow.for_read(src)
                if copy == src:  # the user's file: moved as a copy, the original left
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    if os.path.isdir(src):
                        shutil.copytree(src, target, dirs_exist_ok=True)
                    else:
                        shutil.copyfile(src, target)
                    shadow.for_write(dst, always=True)
                    return None
                return _original(copy, shadow.for_write(dst, always=True), *args, **kwargs)
            if shadow.users(dst) or os.path.lexists(target):
                return _original(src, shadow.for_write(dst, always=True), *args, **kwargs)
            return _original(src, dst, *args, **kwargs)

        patches.set(os, name, moved)


def _model_state_writers(patches: Patches, shadow: Shadow) -> None:
    """``torch.save`` and safetensors' ``save_file``: always to the copy (what they write is fake)."""
    import torch
    import torch.serialization as serialization

    original_save = serialization.save
    skip_data = getattr(serialization, "skip_data", None)

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, (str, bytes, os.PathLike)):
            f = shadow.for_write(f, always=True)
        if skip_data is None:
            return original_save(obj, f, *args, **kwargs)
        # Fake tensors have no data to write (pickling one fails on its mode's weak references):
        # their shapes and dtypes are written, the bytes left empty, as PyTorch's own skip_data does.
        with skip_data(materialize_fake_tensors=True):
            return original_save(obj, f, *args, **kwargs)

    patches.set(serialization, "save", save)
    patches.set(torch, "save", save)
    for module in _safetensors_modules():
        original = getattr(module, "save_file", None)
        if original is None:
            continue

        def save_file(tensors: Any, filename: Any, *args: Any, _original: Callable = original, **kwargs: Any) -> Any:
            return _original(tensors, shadow.for_write(filename, always=True), *args, **kwargs)

        patches.set(module, "save_file", save_file)


def _safetensors_modules() -> list[Any]:
    found = []
    try:
        import safetensors.torch as for_torch

        found.append(for_torch)
    except Exception:  # noqa: BLE001 - not installed
        pass
    try:
        import safetensors.numpy as for_numpy

        found.append(for_numpy)
    except Exception:  # noqa: BLE001 - not installed, or numpy is not
        pass
    return found
