"""nccl-tests' bandwidth conventions, shared by the comm probe's sweep and the recommender.

``S`` is a collective's size in bytes, ``t`` its time in seconds, ``n`` the ranks in its group.
Torch-free: both processes import it.
"""

from __future__ import annotations

# Bus-bandwidth factor per op as a function of the group size n (nccl-tests' PERFORMANCE.md).
_BUS_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
}

def bus_factor(op: str, group_size: int) -> float:
    """nccl-tests' bus-bandwidth factor for ``op`` on ``group_size`` ranks (dimensionless).

    Raises ``ValueError`` for an op without a defined factor, naming the valid ops.
    """
    try:
        factor = _BUS_FACTORS[op]
    except KeyError:
        raise ValueError(f"no bus-bandwidth factor for op {op!r}; valid: {sorted(_BUS_FACTORS)}") from None
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    return factor(group_size)


def algbw(nbytes: float, time_s: float) -> float | None:
    """Algorithm bandwidth S / t in bytes per second; None when the time is not positive."""
    return nbytes / time_s if time_s > 0 else None


def busbw(op: str, nbytes: float, time_s: float, group_size: int) -> float | None:
    """Bus bandwidth in bytes per second: algbw times the op's factor (None for unknown ops)."""
    bw = algbw(nbytes, time_s)
    if bw is None or op not in _BUS_FACTORS or group_size < 1:
        return None
    return bw * bus_factor(op, group_size)
