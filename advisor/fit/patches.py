"""Attributes replaced for the length of a fit, and put back in the reverse order on the way out."""

from __future__ import annotations

from typing import Any

_MISSING = object()


class Patches:
    """``set(owner, name, value)`` remembers what was there; ``restore()`` undoes every set, last first."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """Replace ``owner.name`` with ``value``. On a class, what its own ``__dict__`` held is kept
        (a ``classmethod`` or ``property`` object, not what getattr makes of it); an inherited
        attribute is deleted again on restore."""
        previous = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)
        self._undo.append((owner, name, previous))
        setattr(owner, name, value)

    def restore(self) -> None:
        while self._undo:
            owner, name, previous = self._undo.pop()
            if previous is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, previous)
