"""Names for the models and optimizers a script holds, as the script itself calls them.

A GAN's generator and discriminator both have a ``main.3``; their rows must not merge, so
every module name carries its model's name once a script has several models
(``netG.main.3``). The name is the variable or attribute that holds the object in the
script: a local of a calling frame in the user's code, an attribute of that frame's
``self``, or a global of the script (``__main__``). When none holds it, the class name
is used, with ``_1``, ``_2`` ... for later objects of the same class.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType
from typing import Any, Iterable

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the advisor package
_TORCH = os.path.dirname(os.path.abspath(sys.modules["torch"].__file__ or "")) if "torch" in sys.modules else ""
# runpy's frames hold no model; installed libraries (under it: site-packages) name it generically
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"])
_MAX_FRAMES = 40


def _is_user_frame(frame: FrameType) -> bool:
    path = frame.f_code.co_filename
    if path.startswith("<"):
        return False
    path = os.path.abspath(path)
    return not any(path.startswith(root + os.sep) for root in (_HERE, _TORCH, _STDLIB) if root)


def _match(items: Iterable[tuple[str, Any]], targets: tuple[Any, ...]) -> str | None:
    for name, value in items:
        if not name.startswith("__") and any(value is t for t in targets):
            return name
    return None


def find_variable_name(*targets: Any, frame: FrameType | None = None) -> tuple[str | None, str]:
    """The name a script gives any of ``targets``, and where it was found.

    Returns ``(name, source)`` with ``source`` one of "local", "attribute", "global", or
    ``(None, "")``. Only the script's frames are searched, innermost first: not the standard
    library's, installed packages', torch's or ours.
    """
    frame = frame or sys._getframe(1)
    seen = 0
    while frame is not None and seen < _MAX_FRAMES:
        seen += 1
        if _is_user_frame(frame):
            local = frame.f_locals
            name = _match(((k, v) for k, v in local.items() if k != "self"), targets)
            if name:  # a script's top level holds its globals in its frame's locals
                return name, "global" if frame.f_code.co_name == "<module>" else "local"
            owner = local.get("self")
            attrs = getattr(owner, "__dict__", None)
            if isinstance(attrs, dict):
                name = _match(attrs.items(), targets)
                if name:
                    return name, "attribute"
                modules = attrs.get("_modules")  # an nn.Module holding the model as a child
                if isinstance(modules, dict):
                    name = _match(modules.items(), targets)
                    if name:
                        return name, "attribute"
        frame = frame.f_back
    main = sys.modules.get("__main__")
    if main is not None:
        name = _match(list(vars(main).items()), targets)
        if name:
            return name, "global"
    return None, ""


def unique_label(preferred: str | None, cls_name: str, taken: Iterable[str]) -> str:
    """``preferred`` if free, else the class name, suffixed ``_N`` until unused."""
    used = set(taken)
    if preferred and preferred not in used:
        return preferred
    base = preferred or cls_name
    if base not in used:
        return base
    index = 1
    while f"{base}_{index}" in used:
        index += 1
    return f"{base}_{index}"
