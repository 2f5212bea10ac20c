"""Expandable allocator segments, the predictor half (for ``rules/fragmentation.py``'s finding).

``restart``: the CUDA caching allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` when it starts, so the
setting goes into the plan's environment (``advisor.records.plan.Plan.env``), which
``advisor attach --plan`` puts into the training process's environment. Its applier
(``apply/remedies/expandable_segments.py``) changes nothing: it checks, in the training process,
that the allocator got the setting, so a plan run without it fails loudly instead of silently.

Prediction: the reserve recovered, ``reserved - allocated``: expandable segments grow one mapping
instead of caching fixed blocks, so the reserve tracks the allocation (the peak figures of this
recommendation are the allocator's reserve). Step time is unchanged.
"""

from __future__ import annotations

from advisor.recommend.finding import Finding, Proposal, gib
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.rules.fragmentation import fragment
from advisor.records.advice import Prediction, Recommendation

ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def propose(profile: Profile, finding: Finding) -> Proposal:
    found = fragment(profile)
    if found is None:
        return Proposal()
    step = profile.step_time_s
    env = ", ".join(f"{k}={v}" for k, v in ENV.items())
    return Proposal(recommendations=(Recommendation(
        id="expandable-segments", remedy=SPEC.name,
        title=f"Expandable allocator segments: recover {gib(found.free)} of cached reserve",
        params={},
        predicted=Prediction(peak_memory_bytes=found.allocated, step_time_s=step),
        baseline=Prediction(peak_memory_bytes=found.reserved, step_time_s=step),
        budget_bytes=profile.budget_bytes,
        cost_model="reserved bytes fall to the allocated bytes (peak figures here are the allocator's reserve)",
        confidence="medium", exact=True, live=False, apply_class=SPEC.apply_class,
        prerequisites=[f"restart with {env} (written into the plan's environment)"],
        evidence=[f"{gib(found.reserved)} reserved, {gib(found.allocated)} allocated"
                  + (f"; the OOM asked for {gib(found.requested or 0)}" if found.blocked else "")],
    ),))


SPEC = RemedySpec(name="expandable_segments", apply_class="restart", phase="saved-tensors",
                  addresses=("fragmentation",), propose=propose, plan_env=ENV)
