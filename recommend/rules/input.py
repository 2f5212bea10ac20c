"""Input rule: data wait above 5% of the step; it proposes more DataLoader workers (and pinning
on CUDA) on the script's own loader.

Evidence: the median light-step ``data_s`` phase against the step time, and the loader as the
agent captured it (``Profile.loaders``: workers, pinning, prefetch, the host's CPU count).

Prediction, with ``D`` the measured wait per step, ``C = step - D`` the rest of the step and
``w`` the current workers: one batch takes a worker ``T = D`` to load with no workers, else
``T = w (D + C)`` (w workers deliver one batch per ``D + C``). With ``w'`` workers a batch is
ready every ``T / w'``, so the wait left is ``max(0, T / w' - C)`` and the step
``C + max(0, T / w' - C)``: the wait hidden behind compute is the rest.
"""

from __future__ import annotations

import math
from typing import Any

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import dataloader
from advisor.recommend.rules._figures import ms
from advisor.records.advice import Prediction, Recommendation

DATA_LOADING_SHARE = 0.05  # data wait above this share of the step deserves advice
MAX_WORKERS = 8  # never propose more workers than this (each one is a process with the dataset)


def workers_for(load_s: float, compute_s: float, cpu_count: int) -> int:
    """Enough workers to hide a batch's load behind compute, within the host's CPUs (at least 2)."""
    need = math.ceil(load_s / compute_s - 1e-9) if compute_s > 0 else MAX_WORKERS  # 3.0000000004 is 3
    return max(1, min(need, MAX_WORKERS, max(2, cpu_count)))


def _recommend(profile: Profile, loader: dict[str, Any], wait: float, step: float) -> Recommendation | None:
    compute = step - wait
    current = int(loader.get("num_workers") or 0)
    load = wait if current == 0 else current * (wait + compute)
    workers = max(current, workers_for(load, compute, int(loader.get("cpu_count") or 1)))
    cuda = profile.device.get("type") == "cuda"
    pin = True if cuda and not loader.get("pin_memory") else None
    if workers == current and pin is None:
        return None
    left = max(0.0, load / workers - compute) if workers else wait
    params: dict[str, Any] = {"loader": int(loader.get("index", 0)), "num_workers": workers}
    if pin:
        params["pin_memory"] = True
    if workers > 0 and not loader.get("prefetch_factor"):
        params["prefetch_factor"] = 2
    changes_streams = workers != current
    why = ("the worker count changes the per-worker random streams a dataset's random transforms draw "
           "from (the batch order is kept)") if changes_streams else "pinning only: no value changes"
    return Recommendation(
        id="dataloader-workers", remedy=dataloader.SPEC.name,
        title=f"DataLoader with {workers} workers" + (" and pinned memory" if pin else "")
              + f": hide the {ms(wait)} data wait behind compute",
        params=params,
        predicted=Prediction(peak_memory_bytes=None, step_time_s=compute + left),
        baseline=Prediction(peak_memory_bytes=None, step_time_s=step),
        cost_model=f"batch load {ms(load)} over {workers} workers against {ms(compute)} of compute per step",
        confidence="medium", exact=not changes_streams, live=True,
        apply_class="live-opt-in" if changes_streams else "live-equivalent",
        prerequisites=[why, "live at once: the running iterator restarts on its remaining batches"],
        evidence=[f"data wait {ms(wait)} of a {ms(step)} step", f"{current} worker(s) now"],
        fits=True,
    )


def input_rule(profile: Profile) -> Finding | None:
    """Data loading above 5% of the step."""
    data, step = profile.phases.get("data_s"), profile.step_time_s
    if not data or not step or data <= DATA_LOADING_SHARE * step:
        return None
    share = data / step
    evidence: list[dict[str, object]] = [
        {"what": "data wait / step time", "value": round(share, 4), "threshold": DATA_LOADING_SHARE},
        {"what": "data wait per step", "value": round(data, 6), "unit": "s"},
    ]
    recs = [r for loader in profile.loaders[:1] if (r := _recommend(profile, loader, data, step))]
    if not profile.loaders:
        evidence.append({"what": "no remedy", "value": "needs a torch DataLoader built under the advisor "
                                                      "(none reported: a custom loader cannot be tuned)"})
    return Finding(
        bottleneck="input",
        summary=f"waiting for data takes {share:.0%} of the step",
        severity=share,  # below any memory finding (>= 1)
        evidence=evidence,
        recommendations=recs,
    )


RULE = input_rule
