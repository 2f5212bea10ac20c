"""``Trainer(..., callbacks=[AdvisorCallback()])``: the Hugging Face ``Trainer``'s run as an
in-process session (advisor/api.py), from ``on_train_begin`` to ``on_train_end``.

The Trainer has built its model and optimizer when training begins: the session finds them (the
optimizer at once, the model at its first forward). Its optimizer steps are the session's step
boundaries and their losses the steps' losses (advisor/integrations/common.py). A run that raises
never reaches ``on_train_end``: the next ``on_train_begin``, ``close()`` or the interpreter's exit
ends that session.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from advisor.integrations.common import SessionCallback


class AdvisorCallback(SessionCallback, TrainerCallback):
    """Record a ``Trainer.train()`` run: the same arguments as ``advisor.session()``."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._run.begin(global_step=state.global_step, default_name=getattr(args, "run_name", None) or "trainer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._run.step(global_step=state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._run.end()
