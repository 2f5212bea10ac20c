"""Fragmentation rule (CUDA): the caching allocator reserves much more than the tensors use at
the peak, or an OOM happened while enough reserve was free; it proposes expandable segments.

Evidence: ``Profile.reserved_at_peak`` / ``allocated_at_peak`` (``torch.cuda.memory_reserved`` /
``memory_allocated`` at the peak sample), or the OOM event's ``reserved_bytes``,
``allocated_bytes`` and ``requested_bytes``. Fires when reserved - allocated is at least
``FRAGMENT_SHARE`` of reserved and ``MIN_FRAGMENT_BYTES``, or when an OOM asked for no more than
the free reserve (the bytes were there, in pieces).

Prediction: the reserve recovered, ``reserved - allocated``: expandable segments grow one
mapping instead of caching fixed blocks, so the reserve tracks the allocation. Step time is
unchanged.
"""

from __future__ import annotations

from advisor.recommend.finding import Finding, gib
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import expandable_segments
from advisor.records.advice import Prediction, Recommendation

FRAGMENT_SHARE = 0.2  # free reserve at the peak above this share of the reserve
MIN_FRAGMENT_BYTES = 256 * 2**20  # and at least this much


def fragmentation_rule(profile: Profile) -> Finding | None:
    oom = profile.oom or {}
    oom_reserved, oom_allocated = oom.get("reserved_bytes"), oom.get("allocated_bytes")
    requested = oom.get("requested_bytes")
    blocked = (oom_reserved is not None and oom_allocated is not None and requested is not None
               and 0 < int(requested) <= int(oom_reserved) - int(oom_allocated))
    if blocked:
        reserved, allocated = int(oom_reserved), int(oom_allocated)
    elif profile.reserved_at_peak is not None and profile.allocated_at_peak is not None:
        reserved, allocated = profile.reserved_at_peak, profile.allocated_at_peak
    else:
        return None
    free = reserved - allocated
    share = free / reserved if reserved else 0.0
    if not blocked and (share < FRAGMENT_SHARE or free < MIN_FRAGMENT_BYTES):
        return None
    evidence: list[dict[str, object]] = [
        {"what": "reserved - allocated" + (" at the OOM" if blocked else " at the peak"), "value": free, "unit": "bytes"},
        {"what": "(reserved - allocated) / reserved", "value": round(share, 4), "threshold": FRAGMENT_SHARE},
    ]
    if blocked:
        evidence.append({"what": "OOM request within the free reserve", "value": int(requested), "unit": "bytes"})
    step = profile.step_time_s
    env = ", ".join(f"{k}={v}" for k, v in expandable_segments.ENV.items())
    rec = Recommendation(
        id="expandable-segments", remedy=expandable_segments.SPEC.name,
        title=f"Expandable allocator segments: recover {gib(free)} of cached reserve",
        params={},
        predicted=Prediction(peak_memory_bytes=allocated, step_time_s=step),
        baseline=Prediction(peak_memory_bytes=reserved, step_time_s=step),
        cost_model="reserved bytes fall to the allocated bytes (peak figures here are the allocator's reserve)",
        confidence="medium", exact=True, live=False, apply_class=expandable_segments.SPEC.apply_class,
        prerequisites=[f"restart with {env} (written into the plan's environment)"],
        evidence=[f"{gib(reserved)} reserved, {gib(allocated)} allocated"
                  + (f"; the OOM asked for {gib(int(requested))}" if blocked else "")],
        fits=True,
    )
    return Finding(bottleneck="memory",
                   summary=("out of memory with enough free reserve: fragmentation" if blocked
                            else f"the allocator caches {gib(free)} no tensor uses at the peak"),
                   severity=2.5 if blocked else share,  # an OOM it explains blocks the run: first
                   evidence=evidence, recommendations=[rec])


RULE = fragmentation_rule
