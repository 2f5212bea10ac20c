"""The controller's background work runs below the training job's priority.

The advice (bursts of 0.1-1 s of CPU after each deep step), the intake of the records (a deep
step's thousands at once) and the store's writes run while the job trains on the same cores: on
two cores an advice burst slowed an 11 ms step to 13-18 ms for several steps, which the step-time
baselines and the apply windows then read. A thread that calls ``lower_priority`` gets nice +10
(Linux keeps a nice value per thread): when it competes with the job's threads they get ~10 times
its CPU share, and on an idle core it runs at full speed. The controller's process keeps its
priority (the training processes it launches inherit it), and so do its user-facing threads (the
TUI, the control server) and each rank's handshake.
"""

from __future__ import annotations

import os
import sys
import threading

BACKGROUND_NICENESS = 10


def lower_priority(steps: int = BACKGROUND_NICENESS) -> None:
    """Lower the calling thread's scheduling priority by ``steps``; nothing where the platform has
    no per-thread priority or forbids it (the work then runs at the job's priority, as before)."""
    if sys.platform != "linux":
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + steps)
    except OSError:
        pass
