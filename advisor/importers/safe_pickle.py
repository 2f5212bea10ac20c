"""Load a pickle of plain data only: every global is refused, so no class is ever constructed.

``torch.cuda.memory._dump_snapshot`` pickles a dict of lists, dicts, strings, numbers and
tuples. Unpickling runs code only through globals (``GLOBAL``/``STACK_GLOBAL``/``EXT*`` resolve
a callable that ``REDUCE``/``BUILD``/``NEWOBJ`` then call) and persistent ids; this unpickler
refuses both before anything is resolved, so a ``__reduce__`` payload fails at its first
opcode that names a callable. Files over ``MAX_BYTES`` are refused before they are read.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

MAX_BYTES = 4 << 30  # a snapshot with a long trace and deep stacks runs to gigabytes


class UnsafePickleError(ValueError):
    """The pickle names a global or a persistent object (it would run code to load)."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(
            f"refused: the pickle asks for {module}.{name}; a memory snapshot holds only plain data, "
            "so this file is not one (or was tampered with)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused: the pickle refers to a persistent object; a memory snapshot has none")


def load_plain(path: Path, *, max_bytes: int = MAX_BYTES) -> Any:
    """Unpickle ``path`` allowing only built-in containers, strings and numbers.

    Raises ``UnsafePickleError`` for a pickle that needs a global, ``ValueError`` for one over
    ``max_bytes`` or one that is not a readable pickle.
    """
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ValueError(f"{path} is {size} bytes, over the {max_bytes}-byte limit for a snapshot")
    with open(path, "rb") as handle:
        data = handle.read(max_bytes + 1)
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is one clear error
        raise ValueError(f"{path} is not a readable pickle ({type(exc).__name__}: {exc})") from None
