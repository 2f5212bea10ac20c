"""How a fit answers the value reads of PyTorch's iterative solvers: as if each ran to its limits.

``torch.optim.LBFGS`` keeps a history of correction pairs that grows by one per inner iteration
(up to ``history_size``), and ends its iterations on value tests: the curvature test ``ys > 1e-10``
keeps a pair, the strong Wolfe test accepts a line-search step, and ``abs(loss - prev_loss) <
tolerance_change`` and the gradient tests end the loop. A fit's placeholders (``advisor.fit.reads``:
False, a constant 1.0) answered "no pair" and "no change in loss", so every step ended after its
first iteration with an empty history: the zoo's LBFGS script was fitted at 24 MB against 43.8 MB
measured, its 20 MB of history missing.

Reads made in the solver's own code are answered here instead: the tests that keep a pair or accept
a step answer yes, the other boolean tests (converged? no progress?) no, and each float read (a
loss) a value of a decreasing sequence, so no two losses are equal. The solver then runs
``max_iter`` iterations a step, one evaluation each, and its history grows as fast as it can: the
fit's figure is the most the solver holds after the fit's steps, which a run that converges sooner
stays under. The report counts these reads (``run.solver_reads``).
"""

from __future__ import annotations

import os
from typing import Any

import torch

# Solver source file (relative to torch's folder) -> (name, the tests that answer yes).
_SOLVERS: dict[str, tuple[str, tuple[str, ...]]] = {
    os.path.join("optim", "lbfgs.py"): ("LBFGS", ("ys > 1e-10", "abs(gtd_new) <= -c2 * gtd")),
}
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__))
FILES = {os.path.join(_TORCH_DIR, path): solver for path, solver in _SOLVERS.items()}  # real path -> solver


class SolverReads:
    """Answers the reads made in a known solver's code (see the module docstring); ``counts``:
    solver -> reads answered."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._floats = 0

    def answer(self, tensor: Any, path: str, line: str) -> Any:
        """The value of a read of ``tensor`` made by ``line`` of solver file ``path`` (a key of FILES)."""
        name, accepts = FILES[path]
        self.counts[name] = self.counts.get(name, 0) + 1
        dtype = getattr(tensor, "dtype", torch.float32)
        if dtype == torch.bool:
            return any(test in line for test in accepts)
        if dtype.is_floating_point:
            self._floats += 1
            return 1.0 / self._floats  # a loss that keeps falling: never "no change"
        return 0
