"""A larger DDP bucket, the predictor half (for ``rules/communication.py``'s finding).

``restart``: DDP fixes ``bucket_cap_mb`` when the wrapper is built (its C++ ``Reducer`` is
constructed with the bucket size and only rebuilds the buckets once, after the first step, from
that same cap); no public API changes it on the script's DDP object, and a new DDP instance is
not the object the script's loop calls. The recommendation carries the exact change.

Prediction: one call in ``BUCKET_GROWTH``, so the calls' cost beyond their bytes
(``CommFigures.latency_s``) shrinks to 1/``BUCKET_GROWTH``.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.rules._figures import ms
from advisor.recommend.rules.communication import comm_figures, recommend
from advisor.records.advice import Prediction

DDP_DEFAULT_BUCKET_MB = 25  # torch's default bucket_cap_mb
BUCKET_GROWTH = 4  # the larger bucket proposed: this many times the default
CAP_MB = DDP_DEFAULT_BUCKET_MB * BUCKET_GROWTH
CHANGE = f"DistributedDataParallel(model, ..., bucket_cap_mb={CAP_MB})"


def validate(params: Mapping[str, Any]) -> None:
    value = params.get("bucket_cap_mb")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"bucket_cap_mb must be a positive number of MiB, not {value!r}")


def propose(profile: Profile, finding: Finding) -> Proposal:
    figures = comm_figures(profile)
    if figures is None or not figures.ddp or figures.grad_calls <= 1:
        return Proposal()
    saved = min(figures.exposed_s, figures.latency_s * (1 - 1 / BUCKET_GROWTH))
    if saved <= 0:
        return Proposal()
    return Proposal(recommendations=(recommend(
        figures, budget_bytes=profile.budget_bytes, id="ddp-bucket", remedy=SPEC.name,
        title=f"Larger DDP buckets ({CAP_MB} MiB): fewer all-reduce calls per step",
        params={"bucket_cap_mb": CAP_MB},
        predicted=Prediction(peak_memory_bytes=None, step_time_s=figures.step_s - saved),
        cost_model=f"per-call cost beyond bytes / bus bandwidth ({ms(figures.latency_s)}) cut to 1/{BUCKET_GROWTH}",
        confidence="low", exact=True, live=False, apply_class=SPEC.apply_class,
        prerequisites=[f"change: {CHANGE}", "restart: DDP fixes its buckets when it is built"]),))


SPEC = RemedySpec(name="ddp_bucket", apply_class="restart", params=("bucket_cap_mb",), validate=validate,
                  phase="layout", addresses=("communication",), propose=propose, restart_change=CHANGE)
