"""Stream one large JSON array out of a JSON object without loading the file whole.

Kineto traces are one object ``{"schemaVersion": 1, "traceEvents": [...], "distributedInfo": {...}}``
whose ``traceEvents`` array holds nearly all of the bytes. ``stream_object`` walks the top-level
object with ``json.JSONDecoder.raw_decode`` (C speed) over a sliding text buffer: small values
are returned whole, and each element of the streamed key is yielded as soon as it is complete.
Memory is bounded by the buffer (a few MiB) plus the largest single element, which is capped;
top-level values other than the named ones are decoded (to skip them) and let go, so a file of any
size holds O(1) here beyond what ``on_element`` keeps.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
from pathlib import Path
from typing import IO, Any, Callable, Collection, Iterator

CHUNK = 1 << 20  # characters read per refill
# One event (or one small top-level value) larger than this is refused: Kineto's largest events
# (a cat of many tensors, with its shapes) are tens of KiB; decoded, 8 MiB of JSON text can take
# several times that in objects, which must stay small beside a capped address space.
MAX_ELEMENT = 8 << 20

_WS = re.compile(r"[ \t\n\r]*")


class StreamError(ValueError):
    """The file is not a JSON object of the expected shape (message says where)."""


def open_text(path: Path) -> IO[bytes]:
    """The file's bytes, gunzipped on the fly when it starts with the gzip magic."""
    handle = open(path, "rb")
    magic = handle.read(2)
    handle.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=handle, mode="rb")  # type: ignore[return-value]
    return handle


class _Buffer:
    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.pos = 0
        self.eof = False
        self._decode = json.JSONDecoder().raw_decode

    def fill(self) -> bool:
        """Read one more chunk, dropping what was consumed; False at end of file."""
        if self.eof:
            return False
        data = self._raw.read(CHUNK)
        self.text = self.text[self.pos:] + self._decoder.decode(data, final=not data)
        self.pos = 0
        if not data:
            self.eof = True
        return True

    def skip_ws(self) -> str:
        """The next non-blank character (without consuming it); '' at end of input."""
        while True:
            text = self.text
            pos = self.pos = _WS.match(text, self.pos).end()  # type: ignore[union-attr]
            if pos < len(text):
                return text[pos]
            if not self.fill():
                return ""

    def expect(self, char: str, where: str) -> None:
        found = self.skip_ws()
        if found != char:
            raise StreamError(f"expected {char!r} {where}, found {found or 'end of file'!r}")
        self.pos += 1

    def value(self) -> Any:
        """Decode the next complete JSON value, refilling until it is whole."""
        self.skip_ws()
        while True:
            try:
                value, end = self._decode(self.text, self.pos)
            except RecursionError:
                raise StreamError("a JSON value is nested deeper than the reader follows") from None
            except json.JSONDecodeError as exc:  # (before ValueError: it is one)
                if self.eof:
                    raise StreamError(f"malformed JSON: {exc.msg}") from None
                if len(self.text) - self.pos > MAX_ELEMENT:
                    raise StreamError(f"a single JSON value exceeds {MAX_ELEMENT} characters") from None
                self.fill()
                continue
            except ValueError as exc:  # an integer of thousands of digits (Python's conversion limit)
                raise StreamError(f"malformed JSON: {exc}") from None
            # A bare number that ends exactly at the buffer's end may continue in the next chunk.
            if end >= len(self.text) and not self.eof:
                self.fill()
                continue
            self.pos = end
            return value


def stream_object(raw: IO[bytes], array_key: str, on_element: Callable[[Any], None], *,
                  keep: Collection[str] | None = None) -> dict[str, Any]:
    """Walk a top-level JSON object; call ``on_element`` for each item of ``array_key``'s array.

    Returns the object's other keys with their values (only those in ``keep``, when given).
    Raises ``StreamError`` on a file that is not such an object.
    """
    buf = _Buffer(raw)
    buf.expect("{", "at the start of the file (a Chrome trace is a JSON object)")
    others: dict[str, Any] = {}
    if buf.skip_ws() == "}":
        return others
    while True:
        key = buf.value()
        if not isinstance(key, str):
            raise StreamError("an object key is not a string")
        shown = key if len(key) <= 40 else key[:37] + "..."
        buf.expect(":", f"after key {shown!r}")
        if key == array_key:
            for element in _array(buf, key):
                on_element(element)
        else:
            value = buf.value()
            if keep is None or key in keep:
                others[key] = value
        nxt = buf.skip_ws()
        if nxt == ",":
            buf.pos += 1
            continue
        if nxt == "}":
            return others
        raise StreamError(f"expected ',' or '}}' after key {shown!r}, found {nxt or 'end of file'!r}")


def _array(buf: _Buffer, key: str) -> Iterator[Any]:
    buf.expect("[", f"after {key!r}")
    if buf.skip_ws() == "]":
        buf.pos += 1
        return
    while True:
        yield buf.value()
        nxt = buf.skip_ws()
        buf.pos += 1
        if nxt == ",":
            if buf.skip_ws() == "]":  # a trailing comma, as some trace writers leave
                buf.pos += 1
                return
            continue
        if nxt == "]":
            return
        raise StreamError(f"expected ',' or ']' in {key!r}, found {nxt or 'end of file'!r}")
