"""The live terminal UI (Textual). Build it with ``make_app(source)`` and call ``.run()``.

Imports of textual happen only when ``make_app``/``AdvisorApp`` are first used,
so ``advisor.tui.format`` stays importable by the headless printer without
loading textual.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AdvisorApp", "make_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # Deferred on purpose (see the module docstring); the import-graph test still sees it.
        from advisor.tui import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
