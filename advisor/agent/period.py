"""Which optimizer steps make one training step: the loop's period.

A step is one pass over every optimizer that steps in the loop's period. The agent does
not know the period in advance, so it starts from every optimizer the script built (an
optimizer held by another one, such as ZeroRedundancyOptimizer's ``optim``, is stepped from
inside it and left out) and learns from what it sees:

- the step ends when every expected optimizer has stepped since the last boundary;
- when an optimizer steps a second time before that, the period was shorter than
  expected (an optimizer built but not stepped, or replaced by a remedy): the step really
  ended after the previous optimizer step, and the period becomes what stepped since.

Identities are kept as weak references, never as "the first optimizer": a remedy that
builds a new optimizer is learned the same way.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable


class OptimizerPeriod:
    """The expected optimizers of one step and those that stepped since the last boundary."""

    def __init__(self) -> None:
        self._expected: dict[int, weakref.ref] | None = None  # None: not decided yet
        self._stepped: dict[int, weakref.ref] = {}

    @staticmethod
    def _live(refs: dict[int, weakref.ref]) -> dict[int, weakref.ref]:
        return {k: r for k, r in refs.items() if r() is not None}

    def start(self, created: Iterable[Any]) -> None:
        """Take the built optimizers as the first guess, less those another optimizer holds."""
        if self._expected is not None:
            return
        optimizers = list(created)
        inner = {id(v) for o in optimizers for v in vars(o).values() if any(v is x for x in optimizers)}
        self._expected = {id(o): weakref.ref(o) for o in optimizers if id(o) not in inner}

    def is_repeat(self, optimizer: Any) -> bool:
        """``optimizer`` is about to step again before the step was complete."""
        return id(optimizer) in self._stepped and self._stepped[id(optimizer)]() is optimizer

    def learn_from_stepped(self) -> None:
        """The optimizers that stepped since the last boundary are the period."""
        self._expected = self._live(self._stepped)

    def stepped(self, optimizer: Any) -> bool:
        """Record a finished top-level step of ``optimizer``; True when the step is complete."""
        key = id(optimizer)
        self._stepped[key] = weakref.ref(optimizer)
        expected = self._expected
        # Rebuilt only when an expected optimizer is gone (once a step otherwise, cold: it showed).
        if expected is None or any(r() is None for r in expected.values()):
            # every expected optimizer gone (or none yet): this one is the period now
            expected = self._expected = self._live(expected or {}) or {key: weakref.ref(optimizer)}
        stepped = self._stepped
        return all(k in stepped for k in expected)

    def reset(self) -> None:
        """A boundary: nothing stepped in the new step yet."""
        self._stepped = {}

    @property
    def pending(self) -> bool:
        """Some optimizer stepped since the last boundary."""
        return bool(self._stepped)
