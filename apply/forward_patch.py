"""Instance-``forward`` patches: how appliers wrap a module's forward in place and undo it.

``nn.Module.__call__`` looks ``self.forward`` up on the instance first, so a function stored in the
module's ``__dict__`` replaces the class's forward for that module only: the module tree, its
Parameter objects, names and state-dict keys stay as they were (the script's optimizer and any DDP
wrapper keep working). Each remedy marks its forwards with its own attribute, so it can tell its
patch from anyone else's: ``is_patched`` refuses stacking, and ``ForwardPatches.restore`` leaves
(with a warning) a forward that someone replaced after us, since putting ours back would silently
drop their change.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

logger = logging.getLogger("advisor.apply")

_MISSING = object()  # the module had no instance forward: the class's was in use


def is_patched(module: nn.Module, mark: str) -> bool:
    """True when ``module``'s instance forward carries ``mark``."""
    return bool(getattr(module.__dict__.get("forward"), mark, False))


@dataclass(eq=False)
class ForwardPatches:
    """The forwards one handle replaced, restorable newest first. ``what``: the remedy, for logs."""

    mark: str
    what: str
    saved: list[tuple[str, nn.Module, Any]] = field(default_factory=list, repr=False)

    def patch(self, name: str, module: nn.Module, forward: Callable[..., Any]) -> None:
        """Store ``forward`` (marked) as ``module``'s instance forward, remembering the previous one.
        A bound method cannot carry the mark: it is wrapped in a ``functools.partial`` first."""
        try:
            setattr(forward, self.mark, True)
        except AttributeError:
            forward = functools.partial(forward)
            setattr(forward, self.mark, True)
        self.saved.append((name, module, module.__dict__.get("forward", _MISSING)))
        module.__dict__["forward"] = forward

    def restore(self) -> None:
        """Put every previous forward back, newest first; safe to call twice."""
        for name, module, previous in reversed(self.saved):
            if not is_patched(module, self.mark) and "forward" in module.__dict__:
                logger.warning("Not reverting %s of %r: its forward was replaced since", self.what, name)
                continue
            if previous is _MISSING:
                module.__dict__.pop("forward", None)  # the class's forward is visible again
            else:
                module.__dict__["forward"] = previous
        self.saved.clear()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.saved)
