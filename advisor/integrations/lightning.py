"""``Trainer(callbacks=[AdvisorCallback()])``: a Lightning run as an in-process session
(advisor/api.py), from ``on_train_start`` to ``on_train_end`` (or ``on_exception``).

Lightning's automatic optimisation runs the forward and backward inside the optimizer's closure;
the session records it as any closure optimizer: the step ends after ``optimizer.step`` and its
loss is the closure's. Its optimizer steps are the session's step boundaries
(advisor/integrations/common.py). Works with ``lightning`` (``lightning.pytorch``) or the older
``pytorch_lightning`` package.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the package before its rename
    from pytorch_lightning.callbacks import Callback

from advisor.integrations.common import SessionCallback


class AdvisorCallback(SessionCallback, Callback):
    """Record a ``Trainer.fit`` run: the same arguments as ``advisor.session()``."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._run.begin(global_step=trainer.global_step, default_name=type(pl_module).__name__)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._run.step(global_step=trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._run.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._run.end(exception)
