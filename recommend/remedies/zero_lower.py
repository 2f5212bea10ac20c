"""A lower ZeRO stage for a sharded job whose collectives are exposed (no SPEC: ``zero.py`` proposes
it for the communication rule's findings).

The stage in force is read from what the job's collectives move per step (``CollectiveStat``,
the rank of interest's deep steps, DDP's start-up step left out): FSDP reduce-scatters the
gradients once and all-gathers the parameters once per forward and, under ZeRO-3 (parameters
resharded after forward), again in backward. So all-gathered bytes of at least 1.5x the
reduce-scattered ones mean ZeRO-3.

When the exposed collective time is over ``EXPOSED_SHARE`` of the step, ZeRO-2 (keep the
gathered parameters from forward to backward) drops the backward all-gathers, a third of the
traffic (REFERENCE.md: stage 3 moves 1.5x DDP's bytes, stage 2 1x):

    exposed' = exposed x 2/3              step' = step - exposed / 3
    peak'    = peak + P_shard x (N - 1)   (every unit's gathered parameters live until backward;
                                           conservative: the units gathered at the peak today
                                           are counted again)

Applied live (``set_reshard_after_forward(False)``): the same numerics, ``live-exact``.
"""

from __future__ import annotations

from advisor.recommend.finding import Proposal, gib
from advisor.recommend.memory_model import measured_peak
from advisor.recommend.profile import Profile
from advisor.recommend.rules._figures import comm_steps, median_per_step, ms
from advisor.records.advice import Evidence, Prediction, Recommendation

EXPOSED_SHARE = 0.10  # the communication rule's threshold (REFERENCE.md: > 10% of the step)
GATHER_RATIO_STAGE3 = 1.5  # all-gathered / reduce-scattered bytes at or above this: ZeRO-3


def sharded_stage(profile: Profile) -> int | None:
    """2 or 3 from the bytes the job all-gathers and reduce-scatters per step; None when it
    reduce-scatters nothing (not FSDP-sharded) or nothing was measured."""
    by_step = comm_steps(profile.collectives)
    scattered = median_per_step({k: [c for c in v if c.op == "reduce_scatter"] for k, v in by_step.items()}, "bytes")
    gathered = median_per_step({k: [c for c in v if c.op == "all_gather"] for k, v in by_step.items()}, "bytes")
    if scattered <= 0:
        return None
    return 3 if gathered >= GATHER_RATIO_STAGE3 * scattered else 2


def lower_stage(profile: Profile) -> Proposal:
    """ZeRO-2 for a ZeRO-3 job whose exposed collectives take over ``EXPOSED_SHARE`` of the step."""
    step = profile.step_time_s
    if not step or profile.world_size < 2 or sharded_stage(profile) != 3:
        return Proposal()
    by_step = comm_steps(profile.collectives)
    exposed = median_per_step(by_step, "exposed_s")
    share = exposed / step
    if share <= EXPOSED_SHARE:
        return Proposal()
    n = profile.world_size
    shard = int(profile.categories_at_peak.get("parameter", 0))
    peak = measured_peak(profile)
    predicted_peak = peak + shard * (n - 1) if peak else None
    lines = [f"{ms(exposed)} of collectives exposed in a {ms(step)} step ({share:.0%}) under ZeRO-3 "
             "(parameters all-gathered in forward and again in backward)",
             f"ZeRO-2 keeps them gathered until backward: a third less traffic, +{gib(shard * (n - 1))} at the peak"]
    rec = Recommendation(
        id="zero-2",
        remedy="zero",
        title="ZeRO-2: keep the gathered parameters from forward to backward (set_reshard_after_forward(False))",
        params={"stage": 2},
        predicted=Prediction(peak_memory_bytes=predicted_peak, step_time_s=step - exposed / 3),
        baseline=Prediction(peak_memory_bytes=peak or None, step_time_s=step),
        budget_bytes=profile.budget_bytes,
        cost_model="exposed x 2/3 (no backward all-gather); peak + sharded parameters x (N_d - 1)",
        confidence="medium",
        exact=True,
        live=True,
        apply_class="live-exact",
        prerequisites=["the model is sharded by FSDP2 (fully_shard), by the script or by the zero remedy"],
        evidence=lines,
    )
    return Proposal(recommendations=(rec,), evidence=(Evidence(what="ZeRO stage in force (from the collectives)",
                                                               value=3),))
