"""Communication analysis on recorded collectives: bandwidths, exposure, waits, stragglers.

Pure functions on plain numbers and ``advisor.records.samples`` types; no torch, so any saved
session can be analysed again. Conventions follow nccl-tests (see REFERENCE.md,
"Communication"): ``S`` is the collective's size in bytes, ``t`` its time in seconds and
``n`` the number of ranks in its group.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from advisor.records.events import CollectiveSeq, payloads
from advisor.records.intervals import merge_intervals
from advisor.records.samples import Event, ordinary_steps

# ---------------------------------------------------------------- matching across ranks


@dataclass(frozen=True, kw_only=True)
class Arrival:
    """One rank's view of one collective, as needed to match it with the other ranks."""

    rank: int
    step: int
    op: str
    group: str  # process-group name ("" when unknown: the whole world is assumed)
    seq: int  # per-group issue counter, identical on every member for the same call
    start: float  # wall clock when the rank issued it
    time_s: float


@dataclass(frozen=True, kw_only=True)
class MatchedCall:
    """One collective matched across the ranks that issued it."""

    group: str
    seq: int
    op: str
    step: int
    arrivals: dict[int, float]  # rank -> wall-clock issue time
    waits: dict[int, float]  # rank -> latest arrival - own arrival (seconds)
    latest_rank: int
    spread_s: float  # latest - earliest arrival


def match_calls(arrivals: Iterable[Arrival]) -> list[MatchedCall]:
    """Group arrivals by (group, seq, op); only calls seen on at least two ranks are kept.

    The wait a rank spends in a collective because another rank came late is the latest
    arrival minus its own; the rank that arrived last waits zero and causes the others' wait.
    """
    buckets: dict[tuple[str, int, str], list[Arrival]] = defaultdict(list)
    for a in arrivals:
        buckets[(a.group, a.seq, a.op)].append(a)
    out: list[MatchedCall] = []
    for (group, seq, op), items in buckets.items():
        by_rank = {a.rank: a for a in items}
        if len(by_rank) < 2:
            continue
        starts = {r: a.start for r, a in by_rank.items()}
        latest_rank = max(starts, key=lambda r: (starts[r], r))
        latest = starts[latest_rank]
        out.append(
            MatchedCall(
                group=group,
                seq=seq,
                op=op,
                step=min(a.step for a in items),
                arrivals=starts,
                waits={r: latest - s for r, s in starts.items()},
                latest_rank=latest_rank,
                spread_s=latest - min(starts.values()),
            )
        )
    out.sort(key=lambda m: (m.step, m.group, m.seq))
    return out


@dataclass(frozen=True, kw_only=True)
class StragglerReport:
    """Who the others wait for, from matched collectives (seconds summed over all calls)."""

    rank: int  # the straggler: the rank that caused the most waiting
    wait_caused_s: dict[int, float]  # rank -> others' mean wait summed over calls it came last to
    wait_s: dict[int, float]  # rank -> its own wait summed over calls
    skew_s: float  # mean arrival spread (latest - earliest) per matched call
    calls: int


def straggler(matched: Sequence[MatchedCall]) -> StragglerReport | None:
    """The rank others wait for, or None when no call was matched across ranks."""
    if not matched:
        return None
    caused: dict[int, float] = defaultdict(float)
    waited: dict[int, float] = defaultdict(float)
    for m in matched:
        others = [w for r, w in m.waits.items() if r != m.latest_rank]
        caused[m.latest_rank] += sum(others) / len(others) if others else 0.0
        for r, w in m.waits.items():
            waited[r] += w
            caused.setdefault(r, 0.0)
    rank = max(caused, key=lambda r: (caused[r], -r))
    return StragglerReport(
        rank=rank,
        wait_caused_s=dict(caused),
        wait_s=dict(waited),
        skew_s=sum(m.spread_s for m in matched) / len(matched),
        calls=len(matched),
    )


def waits_by_call(matched: Sequence[MatchedCall]) -> Mapping[tuple[int, str, int], float]:
    """(rank, group, seq) -> that rank's wait in that call, for filling per-call wait_s."""
    return {(r, m.group, m.seq): w for m in matched for r, w in m.waits.items()}


# ---------------------------------------------------------------- from records


def arrivals_from_records(collectives: Sequence, events: Sequence) -> list[tuple[object, Arrival]]:
    """Pair each ``CollectiveStat`` with its (group, seq) and build its ``Arrival``.

    The probe sends (op, group, seq, start) per call in ``Event(name="collective_seq")``;
    calls are joined on (rank, op, start). Records without that event fall back to their
    order within (rank, step, op, group size), which is exact when every group is the world.
    Point-to-point ops are never matched (a send pairs with a recv on one peer only).
    """
    seq_of: dict[tuple[int, str, float], tuple[str, int]] = {}
    for e, seq in payloads([e for e in events if isinstance(e, Event)], CollectiveSeq):
        for call in seq.calls:
            seq_of[(e.rank, call.op, float(call.start))] = (call.group, call.seq)
    ordinal: dict[tuple[int, int, str, int], int] = defaultdict(int)
    out: list[tuple[object, Arrival]] = []
    for c in sorted(collectives, key=lambda c: (c.rank, c.step, c.start)):
        if c.op in ("send", "recv"):
            continue
        found = seq_of.get((c.rank, c.op, float(c.start)))
        if found is None:
            key = (c.rank, c.step, c.op, c.group_size)
            found = (f"step{c.step}/n{c.group_size}", ordinal[key])
            ordinal[key] += 1
        group, seq = found
        out.append(
            (c, Arrival(rank=c.rank, step=c.step, op=c.op, group=group, seq=seq, start=c.start, time_s=c.time_s))
        )
    return out


def wait_by_record(collectives: Sequence, events: Sequence) -> tuple[dict[int, float], list[MatchedCall]]:
    """id(record) -> wait in seconds (its rank's wait for the latest rank), and the matches."""
    pairs = arrivals_from_records(collectives, events)
    matched = match_calls(a for _, a in pairs)
    waits = waits_by_call(matched)
    out = {id(rec): waits.get((a.rank, a.group, a.seq), 0.0) for rec, a in pairs}
    return out, matched


def step_comm(collectives: Sequence, steps: Mapping[int, Sequence]) -> list[dict[str, float | int]]:
    """Per (rank, step): step time, communication time, exposed time and its share of the step.

    ``steps`` maps rank -> ``StepSample`` list; ``collectives`` are ``CollectiveStat``s.
    Communication time is the wall time with a collective in flight: the union of the calls'
    intervals within the step, so concurrent calls (DDP's bucket all-reduces) count once and it
    never exceeds the step. Exposed time is the calls' exposed parts summed, at most that union:
    concurrent calls wait in the same stretch of time (two all-reduces 46 ms each, exposed 44
    and 46 ms, summed to 90 ms in a 70 ms step). Only calls issued inside the step's wall-clock
    interval count when the sample has ``end_time``.
    """
    by_step: dict[tuple[int, int], list] = defaultdict(list)
    for c in collectives:
        by_step[(c.rank, c.step)].append(c)
    rows: list[dict[str, float | int]] = []
    for rank, samples in sorted(steps.items()):
        for s in samples:
            calls = by_step.get((rank, s.index), [])
            if s.end_time > 0:
                # Calls issued before the step began (set-up such as DDP's initial broadcast,
                # attributed to step 0) are not part of the step's time.
                begin = s.end_time - s.time_s
                calls = [c for c in calls if c.start >= begin]
                spans = [(c.start, min(c.start + c.time_s, s.end_time)) for c in calls]
            else:  # no clock for the step: the calls' own union, at most the step
                spans = [(c.start, c.start + c.time_s) for c in calls]
            comm_s = min(s.time_s, sum(b - a for a, b in merge_intervals(spans)))
            exp_s = min(comm_s, sum(c.exposed_s for c in calls))
            rows.append(
                {
                    "rank": rank,
                    "step": s.index,
                    "step_time_s": s.time_s,
                    "comm_s": comm_s,
                    "exposed_s": exp_s,
                    "exposed_share": exp_s / s.time_s if s.time_s > 0 else 0.0,
                }
            )
    return rows


@dataclass(frozen=True, kw_only=True)
class RankComm:
    """One rank's communication per step, every figure the median over the same ordinary steps
    (not step 0, not deep-sampled, not right after a deep one; ``ordinary_steps``): the report's ``comm`` rows and the
    communication diagnosis both read these, so they cannot disagree. ``exposed_share`` is the
    median exposed time over the median step time; medians keep the per-step order, so exposed
    <= communication holds for them as it does for each step. Seconds."""

    rank: int
    step_time_s: float
    comm_s: float
    exposed_s: float
    exposed_share: float
    steps: tuple[int, ...]

    def to_dict(self) -> dict[str, float | int]:
        return {"rank": self.rank, "step_time_s": self.step_time_s, "comm_s": self.comm_s,
                "exposed_s": self.exposed_s, "exposed_share": self.exposed_share}


def rank_comm(collectives: Sequence, samples: Sequence, rank: int) -> RankComm | None:
    """``RankComm`` of ``rank`` from its ``StepSample``s and the ``CollectiveStat``s (any ranks);
    None when it has no step."""
    steady = ordinary_steps([s for s in samples if s.rank == rank])
    if not steady:
        return None
    rows = step_comm([c for c in collectives if c.rank == rank], {rank: steady})
    step = float(statistics.median(r["step_time_s"] for r in rows))
    exposed = float(statistics.median(r["exposed_s"] for r in rows))
    return RankComm(rank=rank, step_time_s=step, comm_s=float(statistics.median(r["comm_s"] for r in rows)),
                    exposed_s=exposed, exposed_share=exposed / step if step > 0 else 0.0,
                    steps=tuple(int(r["step"]) for r in rows))
