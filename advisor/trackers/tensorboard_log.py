"""``--log-to tensorboard[:DIR]``: TensorBoard event files, written with ``tensorboardX`` (the
event writer alone: no TensorFlow, no TensorBoard server, no torch). Default folder
``runs/advisor/<session id>`` under the current one, which ``tensorboard --logdir runs`` shows."""

from __future__ import annotations

import os

from advisor.trackers.series import TrackerData

PACKAGE = "tensorboardX"


def log(data: TrackerData, where: str | None) -> str:
    """Write the session to TensorBoard; the folder written."""
    from tensorboardX import SummaryWriter  # the extra advisor[tensorboard]; loaded only when asked for

    logdir = os.path.join(where, data.session_id) if where else os.path.join("runs", "advisor", data.session_id)
    writer = SummaryWriter(logdir=logdir)
    try:
        for step in sorted(data.metrics):
            for name, value in data.metrics[step].items():
                writer.add_scalar(name, value, global_step=step)
        writer.add_text("advisor/findings", data.findings, global_step=0)
        for name, value in data.summary.items():
            if isinstance(value, str):
                writer.add_text(name, value, global_step=0)
            else:
                writer.add_scalar(name, value, global_step=0)
    finally:
        writer.close()
    return os.path.abspath(logdir)
