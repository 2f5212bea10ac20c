"""The garbage collector's pace on deep steps: the script's, not the agent's.

A deep step runs the agent's Python on every op (the memory tracker, the op counter), which
allocates many times what the script does: at 5001 modules a deep step had 300 young
collections against 9 for the same step bare, and each tenth of them, a middle-generation pass,
moved whatever the step held alive then (its tensors, its autograd graph) to the oldest
generation, so a full collection (0.15-0.2 s with such a model in memory) came every deep step
instead of every several steps. ``GcPace.slow`` multiplies the middle generation's threshold (young
collections per middle one) by ``FACTOR`` while deep steps run; the young collections themselves
keep their pace, so garbage cycles die as soon as under python (a slower young threshold kept a
cycle's 4-byte tensor alive through a fit's peak). ``restore`` puts back the script's thresholds,
unless the script set others meanwhile (then its choice stands). A disabled collector is left
alone.
"""

from __future__ import annotations

import gc

FACTOR = 50


class GcPace:
    def __init__(self) -> None:
        self._saved: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (the script's, ours)

    def slow(self) -> None:
        if self._saved is not None or not gc.isenabled():
            return
        theirs = gc.get_threshold()
        if theirs[0] <= 0 or len(theirs) < 2:
            return
        ours = (theirs[0], theirs[1] * FACTOR, *theirs[2:])
        gc.set_threshold(*ours)
        self._saved = (theirs, ours)

    def restore(self) -> None:
        if self._saved is None:
            return
        theirs, ours = self._saved
        self._saved = None
        if gc.get_threshold() == ours:
            gc.set_threshold(*theirs)
