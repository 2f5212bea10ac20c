"""The script's own DataLoader tuned (workers, pinning, prefetch), the predictor half
(for ``rules/input.py``'s finding).

The applier (``apply/remedies/dataloader.py``) sets ``num_workers``, ``pin_memory``,
``prefetch_factor`` and ``persistent_workers`` on the DataLoader object the script built (the
agent captured it, ``advisor/agent/capture.py``) and restarts the running iterator in place on
the remaining indices, so the change is live at once and the batch order is kept. The apply
class is per recommendation: changing the worker count changes the per-worker random streams a
dataset's transforms draw from (``live-opt-in``); pinning and prefetch alone change no value
(``live-equivalent``). The spec names the stricter one.

Prediction, on the loader as the agent captured it (``Profile.loaders``: workers, pinning,
prefetch, the host's CPU count), with ``D`` the measured wait per step, ``C = step - D`` the rest
of the step and ``w`` the current workers: one batch takes a worker ``T = D`` to load with no
workers, else ``T = w (D + C)`` (w workers deliver one batch per ``D + C``). With ``w'`` workers a
batch is ready every ``T / w'``, so the wait left is ``max(0, T / w' - C)`` and the step
``C + max(0, T / w' - C)``: the wait hidden behind compute is the rest. Device memory is left as
it is (workers and pinned buffers are host memory): the peak is predicted unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.rules._figures import ms
from advisor.records.advice import Prediction, Recommendation
from advisor.records.events import DataLoaderSettings

MAX_WORKERS = 8  # never propose more workers than this (each one is a process with the dataset)


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


def workers_for(load_s: float, compute_s: float, cpu_count: int) -> int:
    """Enough workers to hide a batch's load behind compute, within the host's CPUs (at least 2)."""
    need = math.ceil(load_s / compute_s - 1e-9) if compute_s > 0 else MAX_WORKERS  # 3.0000000004 is 3
    return max(1, min(need, MAX_WORKERS, max(2, cpu_count)))


def propose(profile: Profile, finding: Finding) -> Proposal:
    """More workers (and pinning on CUDA) for the first captured loader, when that changes anything."""
    wait, step = profile.phases.get("data_s"), profile.step_time_s
    if not profile.loaders or not wait or not step:
        return Proposal()
    rec = _recommend(profile, profile.loaders[0], wait, step)
    return Proposal(recommendations=(rec,) if rec is not None else ())


def _recommend(profile: Profile, loader: DataLoaderSettings, wait: float, step: float) -> Recommendation | None:
    compute = step - wait
    current = loader.num_workers
    load = wait if current == 0 else current * (wait + compute)
    workers = max(current, workers_for(load, compute, loader.cpu_count))
    pin = True if profile.device.type == "cuda" and not loader.pin_memory else None
    if workers == current and pin is None:
        return None
    left = max(0.0, load / workers - compute) if workers else wait
    params: dict[str, Any] = {"loader": loader.index, "num_workers": workers}
    if pin:
        params["pin_memory"] = True
    if workers > 0 and not loader.prefetch_factor:
        params["prefetch_factor"] = 2
    changes_streams = workers != current
    why = ("the worker count changes the per-worker random streams a dataset's random transforms draw "
           "from (the batch order is kept)") if changes_streams else "pinning only: no value changes"
    peak = measured_peak(profile) or None
    return Recommendation(
        id="dataloader-workers", remedy=SPEC.name,
        title=f"DataLoader with {workers} workers" + (" and pinned memory" if pin else "")
              + f": hide the {ms(wait)} data wait behind compute",
        params=params,
        predicted=Prediction(peak_memory_bytes=peak, step_time_s=compute + left),
        baseline=Prediction(peak_memory_bytes=peak, step_time_s=step),
        budget_bytes=profile.budget_bytes,
        cost_model=f"batch load {ms(load)} over {workers} workers against {ms(compute)} of compute per step",
        confidence="medium", exact=not changes_streams, live=True,
        apply_class="live-opt-in" if changes_streams else "live-equivalent",
        prerequisites=[why, "live at once: the running iterator restarts on its remaining batches"],
        evidence=[f"data wait {ms(wait)} of a {ms(step)} step", f"{current} worker(s) now"],
    )


SPEC = RemedySpec(
    name="dataloader",
    apply_class="live-opt-in",
    optional=("loader", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers"),
    validate=validate,
    phase="layout",
    addresses=("input",),
    propose=propose,
)
