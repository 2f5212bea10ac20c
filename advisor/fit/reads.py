"""What a fit does when the script needs a value that fake tensors do not have.

A fake tensor has a shape and no values, so three kinds of op cannot run on one: reading a value
into Python (``loss.item()``, ``if (x > 0).any():``, ``float(t)``), an op whose output's shape
depends on values (``nonzero``, ``x[mask]``, ``unique``), and a kernel without a fake
implementation (a custom CUDA op). (The script's host data is real, ``advisor.fit.functions``:
reading it works as under python.) ``Reads.unrunnable`` decides, op by op:

- after the steps the fit needs (``steps``), the run stops there, cleanly (``StopTraining``);
- before that, a value read into Python gets a placeholder (False, 0, or 1.0 for a float: a logged
  loss of 1.0, which passes a convergence test and divides; 0.0, "no overflow", to a
  ``GradScaler``) and the run goes on; every such read is counted by line,
  and those before the first optimizer step apart (``ReadLog.early``): a script whose flow depends
  on such a value may not take the path it takes on the target, and the report names each line
  (when it never reaches an optimizer step, the fit fails with them named);
- a read made by the advisor itself (its loss record) gets the placeholder at any time;
- an op whose output shape depends on values, or that has no fake kernel, cannot be given a
  placeholder (its output cannot be guessed): before the first step it ends the fit
  (``FitUnrunnable``, naming the line of the script and the op); after it, the run stops there,
  cleanly, with the op and the line named (``ReadLog.stopped_by``), and the report's figures are
  those of the steps that completed.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor, unset_fake_temporarily

from advisor.fit.solvers import FILES as SOLVER_FILES, SolverReads

_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__))
# This installation's own code (advisor, and its probes/apply/recommend folders, which are
# links under it in a source checkout): never the script's line.
_OURS = tuple({os.path.realpath(os.path.join(os.path.dirname(__file__), "..", name))
               for name in ("", "probes", "apply", "recommend")})


_HERE = os.path.dirname(os.path.realpath(__file__)) + os.sep  # the fake world's own frames
_PASS_THROUGH = tuple(os.path.realpath(os.path.join(os.path.dirname(__file__), "..", name)) + os.sep
                      for name in ("probes", "apply"))  # dispatch modes and patches the script's ops go through


class FitUnrunnable(BaseException):
    """The script cannot be run on fake tensors from here; ``where`` is its line.

    A ``BaseException``: a script's ``except Exception`` must not take it for its own error."""

    def __init__(self, message: str, where: dict[str, Any] | None, op: str, kind: str) -> None:
        super().__init__(message)
        self.where = where
        self.op = op
        self.kind = kind


@dataclass
class ReadLog:
    """The placeholder reads of a fit, by line: (file, line, code) -> count."""

    placeholders: dict[tuple[str, int, str], int] = field(default_factory=dict)
    early: dict[tuple[str, int, str], int] = field(default_factory=dict)  # the reads before the first step
    stopped_at: dict[str, Any] | None = None
    stopped_by: dict[str, Any] | None = None  # an op that could not run after the first step: {op, kind, step}


def script_frame() -> dict[str, Any] | None:
    """The innermost frame of the script's own code on the current stack (not torch's, not ours)."""
    frame = sys._getframe(1)
    while frame is not None:
        if _scripts(frame.f_code.co_filename):
            return _frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def raising_frame(tb: Any) -> dict[str, Any] | None:
    """The innermost frame of the script's own code in traceback ``tb`` (where it raised), or None."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if _scripts(code.co_filename):
            found = _frame(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found


def _scripts(path: str) -> bool:
    if path.startswith("<"):
        return False
    real = os.path.realpath(path)
    return not real.startswith(_TORCH_DIR) and not any(real.startswith(o + os.sep) for o in _OURS)


def _frame(path: str, line: int, function: str) -> dict[str, Any]:
    return {"file": path, "line": line, "function": function, "code": linecache.getline(path, line).strip()}


def solver_frame() -> tuple[str, str] | None:
    """(file, code) of the innermost frame of a known solver's code (``advisor.fit.solvers``) when it
    comes before the script's own (a read inside the script's closure is the script's), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith("<"):
            real = os.path.realpath(path)
            if real in SOLVER_FILES:
                return real, linecache.getline(path, frame.f_lineno)
            if _scripts(path):
                return None
        frame = frame.f_back  # type: ignore[assignment]
    return None


def ours_first() -> bool:
    """Whether the innermost frame outside torch, the fake world and the probes' dispatch modes
    (which pass every op on) is this installation's (the agent reading a loss), not the script's."""
    frame = sys._getframe(1)
    while frame is not None:
        real = os.path.realpath(frame.f_code.co_filename)
        if not real.startswith((_TORCH_DIR, _HERE, *_PASS_THROUGH)) and not frame.f_code.co_filename.startswith("<"):
            return any(real.startswith(o + os.sep) for o in _OURS)
        frame = frame.f_back  # type: ignore[assignment]
    return False


def placeholder(tensor: Any) -> Any:
    """The value a read of ``tensor`` gets: False, 0, or 1.0 for a floating-point value (a loss or a
    norm: 0.0 ended loops at their convergence test, ``if loss < 1e-3: break``, and divided by
    zero), except 0.0 where PyTorch's ``GradScaler`` reads whether gradients overflowed ("no")."""
    dtype = getattr(tensor, "dtype", torch.float32)
    if dtype == torch.bool:
        return False
    if dtype.is_floating_point:
        return 0.0 if _in_grad_scaler() else 1.0
    if dtype.is_complex:
        return 0j
    return 0


def _in_grad_scaler() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith("grad_scaler.py"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class Reads:
    """Decides about each op that cannot run on fake tensors (see the module docstring).

    ``steps_done()``: optimizer steps completed so far; ``steps``: how many the fit needs;
    ``stop(message)`` raises the clean stop (the agent's ``StopTraining``).
    """

    def __init__(self, *, steps: int, steps_done: Callable[[], int], stop: Callable[[str], BaseException]) -> None:
        self.steps = steps
        self.steps_done = steps_done
        self._stop = stop
        self.log = ReadLog()
        # The values of a tensor whose sum is known (a mask's count, ``advisor.fit.sparsity``), or None.
        self.counted: Callable[[Any], list[int] | None] = lambda tensor: None
        self.solvers = SolverReads()  # reads made in LBFGS's own code

    def unrunnable(self, func: Any, exc: Exception, args: tuple[Any, ...]) -> Any:
        op = str(getattr(func, "overloadpacket", func))
        is_read = isinstance(exc, DataDependentOutputException)
        if is_read and ours_first():
            return placeholder(args[0] if args else None)
        where, done = self._within_steps("a value")
        if not is_read:
            kind = "shape" if "DynamicOutputShape" in type(exc).__name__ else "kernel"
            if done == 0:
                raise FitUnrunnable(_explain(kind, op, where, done), where, op, kind)
            self.log.stopped_at, self.log.stopped_by = where, {"op": op, "kind": kind, "step": done}
            raise self._stop(f"advisor fit: stopped early: {_explain(kind, op, where, done)}")
        counted = self.counted(args[0]) if args else None
        if counted:  # a count's read (``mask.sum().item()``): its value, not a placeholder
            return counted[0]
        solver = solver_frame()
        if solver is not None:  # LBFGS's own tests: as if it ran to its limits
            return self.solvers.answer(args[0] if args else None, *solver)
        self._count(where, done)
        return placeholder(args[0] if args else None)

    def array(self, tensor: Any) -> Any:
        """``tensor.numpy()`` (or ``tolist()``) on a fake tensor: a read of all its values, decided
        as ``item()`` is (after the steps, the clean stop; before, zeros of its shape and dtype,
        counted by line). What the script then writes from it goes to the session's ``writes/``
        (``advisor.fit.writes``), never over the user's files (dcgan's ``save_image`` in step 1
        stopped its fit before the tracked step ended)."""
        with unset_fake_temporarily():
            torch.zeros((), dtype=tensor.dtype).numpy()  # raises as a real one would (bfloat16)
        counted = None
        if not ours_first():
            where, done = self._within_steps("tensor data")
            counted = self.counted(tensor)
            if counted is None:
                self._count(where, done)
        with unset_fake_temporarily():
            if counted is not None:  # the tokens of every expert, ``(gates > 0).sum(0).tolist()``
                return torch.tensor(counted, dtype=tensor.dtype).reshape(tuple(tensor.shape)).numpy()
            return torch.zeros(tuple(tensor.shape), dtype=tensor.dtype).numpy()

    def _within_steps(self, what: str) -> tuple[dict[str, Any] | None, int]:
        """The script's line and the steps done; after the last step the run stops there, cleanly."""
        where = script_frame()
        done = self.steps_done()
        if done >= self.steps:
            self.log.stopped_at = where
            raise self._stop(f"advisor fit: stopped at {_line(where)} after {done} step(s): it reads {what} "
                             "that fake tensors do not have")
        return where, done

    def _count(self, where: dict[str, Any] | None, done: int) -> None:
        key = (where or {}).get("file", "?"), (where or {}).get("line", 0), (where or {}).get("code", "")
        counts = self.log.early if done == 0 else self.log.placeholders
        counts[key] = counts.get(key, 0) + 1


def install_array_reads(patches: Any, reads: Reads) -> None:
    """``numpy()`` and ``tolist()`` of a fake tensor go through ``Reads.array``."""

    def numpy_(self: Any, *, force: bool = False) -> Any:
        return reads.array(self)

    def tolist_(self: Any) -> Any:
        if self.dim() == 0:
            return self.item()  # a scalar: read as item() is, with its placeholder
        return reads.array(self).tolist()

    patches.set(FakeTensor, "numpy", numpy_)
    patches.set(FakeTensor, "tolist", tolist_)


def _line(where: dict[str, Any] | None) -> str:
    if where is None:
        return "a line outside the script"
    return f"{where['file']}:{where['line']} ({where['code']})" if where.get("code") else f"{where['file']}:{where['line']}"


def _explain(kind: str, op: str, where: dict[str, Any] | None, done: int) -> str:
    when = "before its first optimizer step" if done == 0 else f"in step {done}"
    if kind == "read":
        return (f"the script reads a value computed by the model at {_line(where)} {when} ({op}): a fit runs "
                "on fake tensors, which have shapes but no values")
    if kind == "shape":
        return (f"an op whose output shape depends on the values ({op}) runs at {_line(where)} {when}: a fit "
                "cannot know that shape")
    return (f"the op {op} at {_line(where)} has no fake implementation (a custom kernel?), so a fit cannot "
            "run it")
