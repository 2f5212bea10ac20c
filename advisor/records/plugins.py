"""Remedy folders under other ``sys.path`` entries: how a remedy is added without editing ours.

A package whose modules are discovered with ``pkgutil`` (``advisor/apply/remedies``,
``advisor/recommend/remedies``) calls ``with_plugins(__path__, "advisor", "apply", "remedies")``:
a folder of that relative path under any ``sys.path`` entry joins the package's ``__path__`` (a
test's faulty remedy, a third party's remedy). ``pkgutil.extend_path`` would search the parent
package's path instead, which holds only ours.
"""

from __future__ import annotations

import os
import sys
from typing import Iterable


def with_plugins(path: Iterable[str], *parts: str) -> list[str]:
    """``path`` with every ``<sys.path entry>/<parts...>`` folder that exists appended, once each."""
    out = list(path)
    for entry in sys.path:
        extra = os.path.join(entry or os.curdir, *parts)
        if os.path.isdir(extra) and not any(os.path.samefile(extra, p) for p in out):
            out.append(extra)
    return out
