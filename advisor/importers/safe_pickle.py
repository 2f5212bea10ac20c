"""Load a pickle of plain data only: every global is refused, so no class is ever constructed.

``torch.cuda.memory._dump_snapshot`` pickles a dict of lists, dicts, strings, numbers and
tuples. Unpickling runs code only through globals (``GLOBAL``/``STACK_GLOBAL``/``EXT*`` resolve
a callable that ``REDUCE``/``BUILD``/``NEWOBJ`` then call) and persistent ids; this unpickler
refuses both before anything is resolved, so a ``__reduce__`` payload fails at its first
opcode that names a callable. Files over ``MAX_BYTES`` are refused before they are read.

Memory: the file is read as it is (never a buffer of the limit's size, which alone failed under
a 4 GiB ``ulimit -v``), and its opcodes are checked before the C unpickler sees them
(``check_opcodes``): a memo index is at most the number of opcodes before it, and a declared
length or frame at most the bytes that follow. The C unpickler sizes its memo by the largest
index it is given: a 10-byte pickle naming memo slot 2^31 made it allocate and clear 16 GiB.
Past this check, what the unpickler builds grows with the file's bytes (a memo reference
repeats an object, it never copies one).
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import stat
from pathlib import Path
from typing import Any

MAX_BYTES = 4 << 30  # a snapshot with a long trace and deep stacks runs to gigabytes
_READ = 1 << 20


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


def _opcode_table() -> tuple[dict[int, int], dict[int, tuple[int, bool]], dict[int, int]]:
    """(opcode -> fixed argument bytes, opcode -> (length-prefix bytes, signed),
    opcode -> newline-ended argument lines), from the standard library's own opcode table."""
    fixed: dict[int, int] = {}
    counted: dict[int, tuple[int, bool]] = {}
    lines: dict[int, int] = {}
    by_kind = {pickletools.TAKEN_FROM_ARGUMENT1: (1, False), pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
               pickletools.TAKEN_FROM_ARGUMENT4U: (4, False), pickletools.TAKEN_FROM_ARGUMENT8U: (8, False)}
    for op in pickletools.opcodes:
        code = ord(op.code)
        n = op.arg.n if op.arg is not None else 0
        if n >= 0:
            fixed[code] = n
        elif n == pickletools.UP_TO_NEWLINE:
            lines[code] = 2 if op.name in ("GLOBAL", "INST") else 1
        else:
            counted[code] = by_kind[n]
    return fixed, counted, lines


_FIXED, _COUNTED, _LINES = _opcode_table()
_STOP, _FRAME = ord(pickle.STOP), ord(pickle.FRAME)
_PUT, _BINPUT, _LONG_BINPUT = ord(pickle.PUT), ord(pickle.BINPUT), ord(pickle.LONG_BINPUT)


def check_opcodes(data: bytes) -> None:
    """``ValueError`` unless every memo index and declared length in ``data`` is within bounds
    (see the module docstring); globals are left to the unpickler, which refuses them."""
    pos, count, end = 0, 0, len(data)
    while pos < end:
        code = data[pos]
        pos += 1
        count += 1
        n = _FIXED.get(code)
        if n is not None:
            if code == _BINPUT:
                index = data[pos] if pos < end else 0
            elif code == _LONG_BINPUT or code == _FRAME:
                index = int.from_bytes(data[pos:pos + n], "little")
                if code == _FRAME:
                    if index > end - pos - n:
                        raise ValueError(f"a frame of {index} bytes in a file with {end - pos - n} left")
                    index = 0
            else:
                index = 0
            if index > count:
                raise ValueError(f"memo slot {index} named after {count} opcodes")
            if code == _STOP:
                return
            pos += n
            continue
        prefix = _COUNTED.get(code)
        if prefix is not None:
            size, signed = prefix
            length = int.from_bytes(data[pos:pos + size], "little", signed=signed)
            pos += size
            if not 0 <= length <= end - pos:
                raise ValueError(f"a value of {length} bytes declared with {end - pos} left")
            pos += length
            continue
        lines = _LINES.get(code)
        if lines is None:
            raise ValueError(f"unknown opcode {code:#04x} at byte {pos - 1}")
        start = pos
        for _ in range(lines):
            newline = data.find(b"\n", pos)
            if newline < 0:
                raise ValueError("a text argument without its end of line")
            pos = newline + 1
        if code == _PUT:
            text = data[start:pos - 1]
            if not text.isdigit() or len(text) > 19 or int(text) > count:
                raise ValueError(f"memo slot {text[:20]!r} named after {count} opcodes")
    raise ValueError("no STOP opcode: the pickle is truncated")


def _read_regular(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, read a chunk at a time; ``ValueError`` for a file that is not a regular
    file (a FIFO would hang) or that holds more than ``max_bytes``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if info.st_size > max_bytes:
            raise ValueError(f"{path} is {info.st_size} bytes, over the {max_bytes}-byte limit for a snapshot")
        chunks, total = [], 0
        while chunk := handle.read(_READ):
            total += len(chunk)
            if total > max_bytes:  # it grew while read
                raise ValueError(f"{path} is over the {max_bytes}-byte limit for a snapshot")
            chunks.append(chunk)
    return b"".join(chunks)


def load_plain(path: Path, *, max_bytes: int = MAX_BYTES) -> Any:
    """Unpickle ``path`` allowing only built-in containers, strings and numbers.

    Raises ``UnsafePickleError`` for a pickle that needs a global, ``ValueError`` for one over
    ``max_bytes`` or one that is not a readable pickle.
    """
    data = _read_regular(path, max_bytes)
    try:
        check_opcodes(data)
    except ValueError as exc:
        raise ValueError(f"{path} is not a readable pickle ({exc})") from None
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is one clear error
        raise ValueError(f"{path} is not a readable pickle ({type(exc).__name__}: {exc})") from None
