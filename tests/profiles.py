"""Synthetic sessions for the recommender's tests, as the records a session holds.

``records_profile`` writes compact test data (module and step rows as dicts, a peak's categories)
into ``MemorySample``, ``ModuleStat``, ``StepSample`` and ``Event`` records and builds the
``Profile`` the one way the advisor does, ``profile_from_records``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from advisor.recommend.profile import Profile, profile_from_records
from advisor.records.samples import Event, MemorySample, ModelInfo, ModuleStat, OptimizerInfo, RunInfo, StepSample


def records_profile(*, peak_bytes: int | None = None, categories_at_peak: Mapping[str, int] | None = None,
                    categories_max: Mapping[str, int] | None = None, modules: Iterable[Mapping[str, Any]] = (),
                    steps: Iterable[Mapping[str, Any] | StepSample] = (), oom: Mapping[str, Any] | None = None,
                    budget_bytes: int | None = None, capacity: int | None = None,
                    models: Iterable[ModelInfo] = (), optimizers: Iterable[OptimizerInfo] = (),
                    events: Iterable[Event] = ()) -> Profile:
    """The profile of a session whose peak sample holds ``categories_at_peak`` (its total
    ``peak_bytes``, by default their sum), with a second sample holding ``categories_max`` when
    given; ``modules`` and ``steps`` are rows of their records' fields (``step`` 1 and rank 0 by
    default); ``oom``: an ``oom`` event's data; ``capacity``: the run's device memory."""
    memory = []
    at_peak = dict(categories_at_peak or {})
    if at_peak or peak_bytes:
        memory.append(MemorySample(step=1, time=0.0, event="peak", categories=at_peak,
                                   total_bytes=sum(at_peak.values()) if peak_bytes is None else peak_bytes))
    if categories_max:
        memory.append(MemorySample(step=1, time=0.0, event="largest", categories=dict(categories_max), total_bytes=0))
    stats = [ModuleStat(**{"step": 1, **row}) for row in modules]
    samples = [s if isinstance(s, StepSample) else StepSample(**s) for s in steps]
    records = list(events) + ([Event(name="oom", data=dict(oom))] if oom is not None else [])
    runs = [RunInfo(script="train.py", argv=[], device={"type": "cpu", "memory_capacity": capacity})] if capacity else []
    return profile_from_records(steps=samples, memory=memory, modules=stats, events=records, runs=runs,
                                models=list(models), optimizers=list(optimizers), budget_bytes=budget_bytes)
