"""Activation offload (alone or mixed with checkpointing), the predictor half.

Proposed when the joint solver (``offload.py``) finds a plan that offloads at least one block and
beats checkpointing alone at the same budget: checkpointing does not fit, or the plan costs less
time. The applier is ``apply/remedies/activation_offload.py``: saved tensors are copied bit for
bit to host memory and back, so ``live-exact``; a mixed plan's recomputed blocks are passed as
``checkpoint`` and applied (and reverted) by the same handle.
"""

from __future__ import annotations

from typing import Any, Mapping

from advisor.recommend.finding import Finding, Proposal, gib, largest_category
from advisor.recommend.memory_model import chain_from_profile, chain_timeline, measured_peak
from advisor.recommend.peak_model import MODEL as PEAK_MODEL
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.remedies.offload import (
    KEEP,
    OFFLOAD,
    RECOMPUTE,
    bandwidth_of,
    fitting,
    model_for,
    tradeoff_curve,
    why,
)
from advisor.records.advice import BlockChoice, Evidence, Prediction, Recommendation
from advisor.records.units import fmt_rate, fmt_seconds


def _names(value: Any, key: str, *, empty_ok: bool) -> None:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{key} must be a list of module names, not {value!r}")
    if not value and not empty_ok:
        raise ValueError(f"{key} is empty: name at least one submodule")
    if not all(isinstance(m, str) and m for m in value) or len(set(value)) != len(value):
        raise ValueError(f"{key} must be distinct non-empty names, got {list(value)!r}")


def validate(params: Mapping[str, Any]) -> None:
    """``modules``: names to offload; ``checkpoint``: names to recompute (optional, disjoint);
    ``min_bytes``: an integer >= 0 (optional)."""
    _names(params.get("modules"), "modules", empty_ok=False)
    if "checkpoint" in params:
        _names(params["checkpoint"], "checkpoint", empty_ok=True)
        if set(params["checkpoint"]) & set(params["modules"]):
            raise ValueError("a module cannot be both offloaded and checkpointed")
    value = params.get("min_bytes")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"min_bytes must be an integer >= 0, not {value!r}")


def propose(profile: Profile, finding: Finding) -> Proposal:
    budget = finding.budget_bytes
    if not budget or largest_category(profile) not in (None, "activation"):
        return Proposal()  # offloading activations cannot help when model states or others dominate
    chain = chain_from_profile(profile)
    if chain is None:
        return Proposal()
    model = model_for(profile)
    # The measured timeline's simulation where a deep step ran the chain, else the formula.
    memory = chain_timeline(profile, chain)
    joint = fitting(chain, model, budget, optimizer=False, memory=memory)
    alone = fitting(chain, model, budget, allowed=(KEEP, RECOMPUTE), optimizer=False, memory=memory)
    lowest = (Evidence(what="lowest peak with activation offload and checkpointing", value=joint.peak_bytes,
                       unit="bytes", threshold=budget),)
    if not joint.feasible:
        return Proposal(evidence=lowest, lowest_peak_bytes=joint.peak_bytes)
    if OFFLOAD not in joint.choices:
        return Proposal(evidence=lowest)
    bandwidth, source = bandwidth_of(profile)
    if alone.feasible and (alone.overhead_s <= joint.overhead_s or source != "measured"):
        # Checkpointing alone fits: its own recommendation covers it, unless offload beats it on a
        # measured link (an assumed link speed is no ground to prefer copies over recompute).
        return Proposal(evidence=lowest)
    offloaded = joint.blocks(chain, OFFLOAD)
    recomputed = joint.blocks(chain, RECOMPUTE)
    versus = (f"checkpointing alone costs {fmt_seconds(alone.overhead_s)}" if alone.feasible
              else f"checkpointing alone cannot fit (lowest peak {gib(alone.peak_bytes)})")
    ev = [f"measured peak {gib(measured_peak(profile))} against a budget of {gib(budget)}",
          f"plan: offload {len(offloaded)}, recompute {len(recomputed)} of {chain.n} blocks, "
          f"+{fmt_seconds(joint.overhead_s)} per step; {versus}",
          f"host link {fmt_rate(bandwidth)} ({source})"] + why(chain, model, joint)
    step = profile.step_time_s
    params: dict[str, Any] = {"modules": offloaded}
    if recomputed:
        params["checkpoint"] = recomputed
    return Proposal(evidence=lowest, recommendations=(Recommendation(
        id=f"offload-{len(offloaded)}" + (f"-checkpoint-{len(recomputed)}" if recomputed else ""),
        remedy=SPEC.name,
        title=(f"Offload {len(offloaded)} block(s) to host memory" + (f", checkpoint {len(recomputed)}" if recomputed else "")
               + f": peak {gib(joint.peak_bytes)}, +{fmt_seconds(joint.overhead_s)}/step"),
        params=params,
        predicted=Prediction(peak_memory_bytes=joint.peak_bytes, step_time_s=None if step is None else step + joint.overhead_s),
        baseline=Prediction(peak_memory_bytes=measured_peak(profile), step_time_s=step),
        budget_bytes=budget,
        cost_model="joint keep/recompute/offload DP: copies hide behind the next block's forward and backward "
                   "(recommend/remedies/offload.py); peak: "
                   + (PEAK_MODEL if memory is not None else "the conservative chain formula"),
        confidence="medium" if source == "measured" and joint.exact else "low",
        exact=True,
        live=True,
        apply_class=SPEC.apply_class,
        prerequisites=["host memory for the offloaded activations (pinned on CUDA)",
                       "the offloaded modules' forward saves what backward needs through autograd"],
        evidence=ev,
        curve=tradeoff_curve(chain, model, memory=memory),
        block_plan=[BlockChoice(name=b.name, choice=c) for b, c in zip(chain.blocks, joint.choices)],
    ),))


SPEC = RemedySpec(
    name="activation_offload",
    apply_class="live-exact",
    params=("modules",),
    optional=("checkpoint", "min_bytes"),
    validate=validate,
    phase="saved-tensors",
    addresses=("memory",),
    propose=propose,
)
