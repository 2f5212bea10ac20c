"""Gradient accumulation under ``no_sync``, the predictor half (for ``rules/communication.py``'s finding).

``restart``: it changes the training loop (k micro-batches per optimizer step, the gradient
all-reduce only on the last) and the effective batch; the recommendation carries the change.
Prediction: one all-reduce per k micro-batches, so per micro-batch the step costs
``step - exposed (1 - 1/k)``, k the power of two at least ``share / EXPOSED_SHARE`` (at least 2).
Each micro-batch is today's batch, so the peak is predicted unchanged (gradients accumulate in
place).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.rules.communication import EXPOSED_SHARE, comm_figures, recommend
from advisor.records.advice import Prediction


def validate(params: Mapping[str, Any]) -> None:
    value = params.get("micro_batches")
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise ValueError(f"micro_batches must be an integer >= 2, not {value!r}")


def propose(profile: Profile, finding: Finding) -> Proposal:
    figures = comm_figures(profile)
    if figures is None or not figures.ddp:
        return Proposal()
    k = max(2, math.ceil(figures.share / EXPOSED_SHARE))
    k = 2 ** math.ceil(math.log2(k))
    return Proposal(recommendations=(recommend(
        figures, budget_bytes=profile.budget_bytes, id="grad-accumulation", remedy=SPEC.name,
        title=f"Accumulate {k} micro-batches under no_sync: one all-reduce per {k} (step time per micro-batch)",
        params={"micro_batches": k},
        predicted=Prediction(peak_memory_bytes=measured_peak(profile) or None,
                             step_time_s=figures.step_s - figures.exposed_s * (1 - 1 / k)),
        cost_model=f"per micro-batch: step - exposed x (1 - 1/{k})",
        confidence="medium", exact=False, live=False, apply_class=SPEC.apply_class,
        prerequisites=[f"change: {change(k)}"]),))


SPEC = RemedySpec(name="grad_accumulation", apply_class="restart", params=("micro_batches",),
                  validate=validate, phase="layout", addresses=("communication",), propose=propose,
                  restart_change="accumulate micro-batches under no_sync in the training loop")


def change(k: int) -> str:
    return (f"accumulate {k} micro-batches per optimizer step: run the first {k - 1} backward passes "
            f"inside `with model.no_sync():`, the last outside it, then optimizer.step(); divide each "
            f"loss by {k} (or the learning rate schedule sees a {k}x larger batch)")
