"""What both trainer callbacks do: a session from train begin to train end, and a check that the
advisor's steps are the trainer's.

The session's steps are found as ``advisor attach`` finds them, at the optimizer steps; a
trainer's global step is one optimizer step too (with gradient accumulation, after the last
micro-batch), so they are the same boundaries, and the step's loss is what its backward calls
ran on (a trainer that divides each micro-batch's loss by the accumulation count logs the same
sum). The callback counts the trainer's steps and, should the two counts differ, says so in the
session's report rather than hiding it.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable

from advisor.api import InProcessSession, session


class TrainerSession:
    """One session per training run (``begin`` at train start, ``end`` at train end)."""

    def __init__(self, *, name: str | None, memory_budget: int | str | None, probes: str | Iterable[str],
                 apply: str | None, allow_inexact: bool, log_to: str | Iterable[str] | None) -> None:
        self._options: dict[str, Any] = {"memory_budget": memory_budget, "probes": probes, "apply": apply,
                                         "allow_inexact": allow_inexact, "log_to": log_to}
        self.name = name
        self.session: InProcessSession | None = None
        self.trainer_steps = 0  # optimizer steps the trainer took while the session was open
        self._first_step = 0

    def begin(self, *, global_step: int, default_name: str | None) -> InProcessSession:
        if self.session is not None and self.session.active:
            self.end()  # an earlier run that raised never reached train end: close it first
        self.session = session(name=self.name or default_name, **self._options).start()
        self._first_step, self.trainer_steps = global_step, 0
        return self.session

    def step(self, *, global_step: int) -> None:
        self.trainer_steps = global_step - self._first_step

    def end(self, exc: BaseException | None = None) -> None:
        current = self.session
        if current is None or not current.active:
            return
        if current.steps != self.trainer_steps:
            message = (f"the trainer took {self.trainer_steps} optimizer step(s) in this session, the advisor found "
                       f"{current.steps}: its step boundaries and losses may not be the trainer's")
            current.note(message)
            warnings.warn(f"advisor: {message}", RuntimeWarning, stacklevel=3)
        current.close(exc)


class SessionCallback:
    """What both callbacks share: the arguments of ``advisor.session()``, the latest run's session,
    and ``close()``. A mixin placed before the trainer library's callback class."""

    def __init__(self, *, name: str | None = None, memory_budget: int | str | None = None,
                 probes: str | Iterable[str] = "all", apply: str | None = None, allow_inexact: bool = False,
                 log_to: str | Iterable[str] | None = None) -> None:
        super().__init__()
        self._run = TrainerSession(name=name, memory_budget=memory_budget, probes=probes, apply=apply,
                                   allow_inexact=allow_inexact, log_to=log_to)

    @property
    def session(self) -> InProcessSession | None:
        """The latest run's session (``.report()``, ``.recommendations()``, ``.apply(id)``)."""
        return self._run.session

    @property
    def trainer_steps(self) -> int:
        """The trainer's optimizer steps in the latest run's session."""
        return self._run.trainer_steps

    def close(self) -> None:
        """End the session now (a run that raised, in a notebook)."""
        self._run.end()
