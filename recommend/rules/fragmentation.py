"""Fragmentation rule (CUDA): the caching allocator reserves much more than the tensors use at
the peak, or an OOM happened while enough reserve was free; its remedy is expandable segments
(``recommend/remedies/expandable_segments.py``).

Evidence: ``Profile.reserved_at_peak`` / ``allocated_at_peak`` (``torch.cuda.memory_reserved`` /
``memory_allocated`` at the peak sample), or the OOM event's ``reserved_bytes``,
``allocated_bytes`` and ``requested_bytes``. Fires when reserved - allocated is at least
``FRAGMENT_SHARE`` of reserved and ``MIN_FRAGMENT_BYTES``, or when an OOM asked for no more than
the free reserve (the bytes were there, in pieces): ``fragment``, which the remedy reads too.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.recommend.finding import Finding, gib
from advisor.recommend.profile import Profile
from advisor.records.advice import Evidence

NAME = "fragmentation"
FRAGMENT_SHARE = 0.2  # free reserve at the peak above this share of the reserve
MIN_FRAGMENT_BYTES = 256 * 2**20  # and at least this much


@dataclass(frozen=True, kw_only=True)
class Fragment:
    """The allocator's reserve no tensor uses: at the peak, or at an OOM it explains (bytes)."""

    reserved: int
    allocated: int
    blocked: bool  # an OOM asked for no more than the free reserve
    requested: int | None  # that OOM's request

    @property
    def free(self) -> int:
        return self.reserved - self.allocated

    @property
    def share(self) -> float:
        return self.free / self.reserved if self.reserved else 0.0


def fragment(profile: Profile) -> Fragment | None:
    """The free reserve when it is large, or explains an OOM; None otherwise."""
    oom = profile.oom
    requested = oom.requested_bytes if oom is not None else None
    if (oom is not None and oom.reserved_bytes is not None and oom.allocated_bytes is not None and requested
            and 0 < requested <= oom.reserved_bytes - oom.allocated_bytes):
        return Fragment(reserved=oom.reserved_bytes, allocated=oom.allocated_bytes, blocked=True, requested=requested)
    if profile.reserved_at_peak is None or profile.allocated_at_peak is None:
        return None
    found = Fragment(reserved=profile.reserved_at_peak, allocated=profile.allocated_at_peak, blocked=False,
                     requested=None)
    return found if found.share >= FRAGMENT_SHARE and found.free >= MIN_FRAGMENT_BYTES else None


def fragmentation_rule(profile: Profile) -> Finding | None:
    found = fragment(profile)
    if found is None:
        return None
    evidence = [
        Evidence(what="reserved - allocated" + (" at the OOM" if found.blocked else " at the peak"), value=found.free,
                 unit="bytes"),
        Evidence(what="(reserved - allocated) / reserved", value=round(found.share, 4), threshold=FRAGMENT_SHARE),
    ]
    if found.blocked:
        evidence.append(Evidence(what="OOM request within the free reserve", value=found.requested, unit="bytes"))
    return Finding(rule=NAME, bottleneck="memory",
                   summary=("out of memory with enough free reserve: fragmentation" if found.blocked
                            else f"the allocator caches {gib(found.free)} no tensor uses at the peak"),
                   severity=2.5 if found.blocked else found.share,  # an OOM it explains blocks the run: first
                   evidence=tuple(evidence))


RULE = fragmentation_rule
