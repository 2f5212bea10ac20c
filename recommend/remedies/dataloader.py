"""The script's own DataLoader tuned (workers, pinning, prefetch), the predictor half
(proposed by ``rules/input.py``).

The applier (``apply/remedies/dataloader.py``) sets ``num_workers``, ``pin_memory``,
``prefetch_factor`` and ``persistent_workers`` on the DataLoader object the script built (the
agent captured it, ``advisor/agent/capture.py``) and restarts the running iterator in place on
the remaining indices, so the change is live at once and the batch order is kept. The apply
class is per recommendation: changing the worker count changes the per-worker random streams a
dataset's transforms draw from (``live-opt-in``); pinning and prefetch alone change no value
(``live-equivalent``). The spec names the stricter one.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.remedies import RemedySpec


def validate(params: Mapping[str, Any]) -> None:
    for key in ("loader", "num_workers"):
        value = params.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{key} must be an integer >= 0, not {value!r}")
    factor = params.get("prefetch_factor")
    if factor is not None and (not isinstance(factor, int) or isinstance(factor, bool) or factor < 1):
        raise ValueError(f"prefetch_factor must be null or an integer >= 1, not {factor!r}")
    for key in ("pin_memory", "persistent_workers"):
        if params.get(key) is not None and not isinstance(params.get(key), bool):
            raise ValueError(f"{key} must be null or a boolean, not {params.get(key)!r}")


SPEC = RemedySpec(
    name="dataloader",
    apply_class="live-opt-in",
    optional=("loader", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers"),
    validate=validate,
    phase="layout",
)
