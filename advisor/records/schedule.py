"""Which steps the agent samples how, for the agent and the controller alike (torch-free).

Deep steps (``deep_steps``, default 1-3) run the probes; one light step in
``LIGHT_TIMING_EVERY`` (steps 4, 9, 14, ...) times the numbered modules' forward
(``advisor/agent/block_timer.py``). The controller's apply waits for the first of those after the
deep steps when the step asked for leaves room (``advisor/advice.py``).
"""

from __future__ import annotations

from typing import Iterable

DEEP_STEPS = (1, 2, 3)
LIGHT_TIMING_EVERY = 5


def light_timing_due(step: int, every: int = LIGHT_TIMING_EVERY) -> bool:
    """Whether ``step`` (when light) times its numbered modules' forward: steps every-1, 2*every-1, ..."""
    return every > 0 and step % every == every - 1


def first_timed_light_step(deep_steps: Iterable[int], every: int = LIGHT_TIMING_EVERY,
                           horizon: int = 1000) -> int | None:
    """The first step after the first deep step that is light and block-timed, or None."""
    deep = set(deep_steps)
    if not deep or every <= 0:
        return None
    return next((k for k in range(min(deep) + 1, min(deep) + horizon)
                 if k not in deep and light_timing_due(k, every)), None)
