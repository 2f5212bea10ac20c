"""Gradient compression through DDP's communication hook, the predictor half.

The applier (``apply/remedies/grad_compression.py``) switches the delegating hook the agent
registered when the script built its DDP wrapper (``advisor/agent/capture.py``: DDP accepts one
hook per object) to compress each bucket to bf16 or fp16 before the all-reduce. The gradients
lose mantissa bits: ``live-opt-in``.

Prediction (for ``rules/communication.py``'s finding): 16-bit buckets halve the transfer at the
measured bus bandwidth (``CommFigures.transfer_s``); what stays exposed is at least 0. The hook
holds a 16-bit copy of each bucket while it is reduced: the peak is bounded by the measured one
plus half the gradient bytes (every bucket in flight at once).
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.rules._figures import ms
from advisor.recommend.rules.communication import comm_figures, recommend
from advisor.records.advice import Prediction

DTYPES = ("bf16", "fp16")


def validate(params: Mapping[str, Any]) -> None:
    if params.get("dtype", "bf16") not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, not {params.get('dtype')!r}")


def propose(profile: Profile, finding: Finding) -> Proposal:
    figures = comm_figures(profile)
    if figures is None or not figures.ddp or figures.transfer_s <= 0:
        return Proposal()
    saved = min(figures.exposed_s, figures.transfer_s / 2)
    peak = measured_peak(profile)
    return Proposal(recommendations=(recommend(
        figures, budget_bytes=profile.budget_bytes, id="grad-compression", remedy=SPEC.name,
        title="Compress gradients to bf16 for the all-reduce (DDP communication hook)",
        params={"dtype": "bf16"},
        predicted=Prediction(peak_memory_bytes=peak + int(figures.grad_bytes / 2) if peak else None,
                             step_time_s=figures.step_s - saved),
        cost_model=f"half the bytes: transfer {ms(figures.transfer_s)} at the measured bus bandwidth halves; "
                   "peak + the 16-bit copies of every bucket",
        confidence="medium", exact=False, live=True, apply_class=SPEC.apply_class,
        prerequisites=["your consent: it changes numerics (gradients summed in bf16): "
                       "--allow-inexact headless, or confirm it in the TUI",
                       "the advisor's delegating hook, installed on every DDP object it sees built "
                       "(not with agent config comm_switch: false)"]),))


SPEC = RemedySpec(name="grad_compression", apply_class="live-opt-in", optional=("dtype",), validate=validate,
                  phase="layout", addresses=("communication",), propose=propose)
