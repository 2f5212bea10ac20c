"""The plain data the recommender reads, built from a session's records.

``profile_from_records(...)`` is the one path the advisor uses: the live
advice loop, ``advisor report`` and ``advisor plan`` all pass it the same
typed records (steps, memory samples, module stats, op stats, collectives,
events) of the regime being advised, so a rule sees the same data wherever
it runs. ``profile_from_report(report)`` reads a saved report JSON instead; it
is kept for ``bench/prediction.py``, which works from ``attach --json`` output.
Nothing here imports torch: any saved session can be re-advised.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from advisor.recommend.comm import RankComm, rank_comm
from advisor.recommend.unreached import extrapolate
from advisor.records.samples import (
    MEMORY_CATEGORIES,
    CollectiveStat,
    Event,
    MemorySample,
    ModelInfo,
    ModuleStat,
    OpStat,
    OptimizerInfo,
    RunInfo,
    StepSample,
)


@dataclass(frozen=True, kw_only=True)
class ModuleProfile:
    """One module as measured on deep-sampled steps (source: probes' ``ModuleStat``).

    ``activation_bytes`` is owned by the innermost module that produced the
    tensors (so a parent's own figure excludes its children; see ``subtree_activation``).
    """

    name: str
    type: str = ""
    depth: int = 0
    parameter_bytes: int = 0
    activation_bytes: int = 0
    input_bytes: int = 0
    output_bytes: int = 0
    forward_s: float = 0.0
    backward_s: float = 0.0
    # Per forward call (``ModuleStat``): the byte and time figures above sum every call of the
    # step. calls == 0 means not recorded: read the totals as one call.
    calls: int = 0
    live_calls: int = 0
    call_activation_bytes: int = 0
    call_input_bytes: int = 0
    call_output_bytes: int = 0
    # What checkpointing it alone frees while it waits for backward, and what only by its own
    # backward (``ModuleStat``; probes/memory/modules.py). None: not measured (older sessions).
    checkpoint_freed_bytes: int | None = None
    checkpoint_freed_late_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Memory and time of one training process, as ``recommend/`` needs them.

    Sizes in bytes, times in seconds. ``budget_bytes`` is the user's memory
    budget or else the device capacity (None when neither is known).
    ``time_scale`` turns module times measured on deep-sampled steps (which
    run probes at 3-6x cost) into times of an ordinary step.
    """

    peak_bytes: int
    budget_bytes: int | None = None
    categories_at_peak: dict[str, int] = field(default_factory=dict)
    categories_max: dict[str, int] = field(default_factory=dict)
    modules: tuple[ModuleProfile, ...] = ()
    step_time_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    oom: dict[str, Any] | None = None
    # Chain members the failed forward never reached (or ran in part), sized from the last one it
    # completed (``recommend/unreached.py``); empty when nothing was filled in.
    unreached_modules: tuple[str, ...] = ()
    time_scale: float = 1.0
    # Forward seconds of numbered modules measured on light steps (StepSample.module_forward_s,
    # the median over the sampled steps): the recompute cost of checkpointing them, preferred to
    # a deep step's module time times ``time_scale`` (recommend/memory_model.py ``live_block``).
    light_forward_s: dict[str, float] = field(default_factory=dict)
    # On the same steps, each module's recompute span (StepSample.module_recompute_s, median): what
    # a checkpoint of it runs again, preferred to its forward (``memory_model.recompute_seconds``).
    light_recompute_s: dict[str, float] = field(default_factory=dict)
    # The rank of interest's deep-step measurements, for rules that read ops or communication
    # (not serialised by ``to_dict``: the report has its own ops and collectives sections).
    ops: tuple[OpStat, ...] = ()
    collectives: tuple[CollectiveStat, ...] = ()
    # That rank's communication per ordinary step (medians), the figures the report's ``comm``
    # section shows for it: the communication diagnosis quotes these (recommend/comm.py).
    comm: RankComm | None = None
    # The job's shape, for remedies that depend on it (source: RunInfo.world_size, ModelInfo.wrapper,
    # the optimizers discovered): data-parallel degree, the first model's wrapper, optimizer count.
    world_size: int = 1
    data_parallel: str | None = None
    optimizer_count: int = 0
    # Devices one process sees (RunInfo.device["count"]: torch.cuda.device_count(), 1 on a CPU) and
    # their type, for remedies that spread a model over them (the pipeline split).
    visible_devices: int = 1
    device_type: str = "cpu"
    # The rank of interest's per-op memory timeline of its deep steps (MemorySample records, bytes):
    # the simulated peak of a checkpointed chain replays it (recommend/peak_model.py).
    memory_timeline: tuple[MemorySample, ...] = ()
    # Pinned host<->device copy bytes/s from the ``device_spec`` event when it measured a real
    # link or was overridden (None: unknown, or a CPU-only device's same-device copy).
    host_link_bandwidth: float | None = None
    # The live in-process pipeline split, from the last ``pipeline_stages`` event its applier sent
    # (stages, devices, micro_batches, mode, stage_times_s: measured forward seconds per stage);
    # None when no split is in force. Read by the repartition rule (remedies/pipeline_repartition.py).
    pipeline: dict[str, Any] | None = None
    # Read by the bottleneck rules (recommend/rules, recommend/remedies); not serialised either.
    # ``device``: the lowest rank's ``device_spec`` event data (``peak_flops`` per dtype key in
    # FLOP/s, ``memory_bandwidth`` in bytes/s, ``type``, ``name``), else the run's device dict.
    device: dict[str, Any] = field(default_factory=dict)
    # CUDA caching allocator at the peak sample (bytes; None off CUDA): reserved - allocated is
    # the cache the allocator holds but no tensor uses (fragmentation's evidence).
    reserved_at_peak: int | None = None
    allocated_at_peak: int | None = None
    # Each rank's median light-step phases in seconds (keys as ``phases`` plus "time_s"): the straggler.
    rank_phases: dict[int, dict[str, float]] = field(default_factory=dict)
    # Every step of the lowest rank with steps: index -> (time_s, data_s), deep and light (rules
    # that compare deep-step measurements, such as op times, with the steps they came from).
    step_times: dict[int, tuple[float, float]] = field(default_factory=dict)
    # The script's DataLoaders as the agent captured them (``dataloader`` events' data:
    # num_workers, pin_memory, prefetch_factor, persistent_workers, batch_size, order, cpu_count).
    loaders: tuple[dict[str, Any], ...] = ()
    # The script's own checkpoint saves of captured state (``checkpoint_save`` events' data, every
    # rank, in arrival order: api "torch.save"/"dcp.save"/"dcp.async_save", saves ["model",
    # "optimizer"], sharded, step, and the event's rank). Read by the ZeRO predictor.
    checkpoint_saves: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes,
            "budget_bytes": self.budget_bytes,
            "categories_at_peak": dict(self.categories_at_peak),
            "categories_max": dict(self.categories_max),
            "modules": [m.to_dict() for m in self.modules],
            "step_time_s": self.step_time_s,
            "phases": dict(self.phases),
            "oom": self.oom,
            "time_scale": self.time_scale,
            "light_forward_s": dict(self.light_forward_s),
            "light_recompute_s": dict(self.light_recompute_s),
        }

    # --- module tree, from qualified names -------------------------------------------------
    def module(self, name: str) -> ModuleProfile | None:
        return self._by_name().get(name)

    def parent(self, name: str) -> str | None:
        """Nearest measured ancestor by dotted name ("" is the model itself); None for the root."""
        if name == "":
            return None
        by_name = self._by_name()
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            candidate = ".".join(parts[:cut])
            if candidate in by_name:
                return candidate
        return "" if "" in by_name else None

    def children(self, name: str) -> list[ModuleProfile]:
        return [m for m in self.modules if m.name != name and self.parent(m.name) == name]

    def is_ancestor(self, ancestor: str, name: str) -> bool:
        """Whether ``ancestor`` contains ``name`` (a module contains itself)."""
        return ancestor == "" or name == ancestor or name.startswith(ancestor + ".")

    def subtree_activation(self, name: str) -> int:
        """Activation bytes produced inside ``name`` and all its descendants."""
        return sum(m.activation_bytes for m in self.modules if self.is_ancestor(name, m.name))

    @property
    def module_activation_total(self) -> int:
        return sum(m.activation_bytes for m in self.modules)

    @property
    def activation_at_peak(self) -> int:
        """Activation bytes live at the peak (falls back to the largest seen, then to the modules' sum)."""
        for source in (self.categories_at_peak, self.categories_max):
            if "activation" in source:
                return int(source["activation"])
        return self.module_activation_total

    def _by_name(self) -> dict[str, ModuleProfile]:
        cache = self.__dict__.get("_cache_by_name")
        if cache is None:
            cache = {m.name: m for m in self.modules}
            object.__setattr__(self, "_cache_by_name", cache)  # frozen: cache outside the fields
        return cache


def profile_from_report(report: Mapping[str, Any], *, budget_bytes: int | None = None) -> Profile:
    """Build a ``Profile`` from a headless report (or a saved session's report).

    Reads ``report["memory"]`` and ``report["steps"]``; the device capacity,
    when the memory section has no budget, comes from ``report["run"]["device"]``
    or ``report["runs"][*]["device"]["memory_capacity"]``.
    """
    memory = dict(report.get("memory") or {})
    steps = report.get("steps") or []
    missing = missing_model_states(report)
    if missing:
        # The measurement predates the first optimizer step (an OOM in step 0, say): the
        # steady state will also hold gradients and optimizer state, so plan for them.
        at_peak = dict(memory.get("categories_at_peak") or {})
        for category, extra in missing.items():
            at_peak[category] = at_peak.get(category, 0) + extra
        memory["categories_at_peak"] = at_peak
        memory["peak_bytes"] = int(memory.get("peak_bytes") or 0) + sum(missing.values())
    return profile_from_memory(memory, steps, capacity_bytes=_capacity(report), budget_bytes=budget_bytes)


# Optimizer state per parameter byte in steady state (REFERENCE.md: Adam keeps exp_avg and exp_avg_sq).
_STATE_FACTOR = {"Adam": 2.0, "AdamW": 2.0, "NAdam": 2.0, "RAdam": 2.0, "Adamax": 2.0, "Adagrad": 1.0,
                 "RMSprop": 1.0, "Adadelta": 2.0, "Rprop": 2.0, "ASGD": 2.0}


def missing_model_states(report: Mapping[str, Any]) -> dict[str, int]:
    """``_missing_model_states`` on a report's ``run`` and ``memory`` sections."""
    run = report.get("run") or {}
    seen = (report.get("memory") or {}).get("categories_max") or {}
    param_bytes = sum(int(m.get("parameter_bytes") or 0) for m in run.get("models") or [])
    return _missing_model_states(seen, completed_step=bool(report.get("steps")), param_bytes=param_bytes,
                                 optimizers=list(run.get("optimizers") or []))


def _missing_model_states(seen: Mapping[str, Any], *, completed_step: bool, param_bytes: int,
                          optimizers: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Gradient and optimizer-state bytes a steady step will hold that the measurement lacks.

    Zero for any session that completed an optimizer step (its measurement has them). For one
    that did not, gradients are one copy of the trainable parameters and the optimizer state
    follows the optimizer's type (SGD: one copy with momentum, none without; unknown: two).
    """
    if completed_step or not param_bytes:
        return {}
    missing: dict[str, int] = {}
    if not seen.get("gradient"):
        missing["gradient"] = param_bytes
    if not seen.get("optimizer_state"):
        factor = 0.0
        for opt in optimizers or [{"name": "unknown"}]:
            name = opt.get("name", "")
            if name == "SGD":
                groups = opt.get("param_groups") or [{}]
                factor = max(factor, 1.0 if any(g.get("momentum") for g in groups) else 0.0)
            else:
                factor = max(factor, _STATE_FACTOR.get(name, 2.0))
        if factor:
            missing["optimizer_state"] = int(param_bytes * factor)
    return missing


def has_measurements(*, steps: Sequence[StepSample], modules: Sequence[ModuleStat],
                     events: Sequence[Event]) -> bool:
    """Whether there is anything to advise on (an OOM before the first step still counts)."""
    return bool(steps) or bool(modules) or any(e.name == "oom" for e in events)


def profile_from_records(
    *,
    steps: Sequence[StepSample],
    memory: Sequence[MemorySample] = (),
    modules: Sequence[ModuleStat] = (),
    ops: Sequence[OpStat] = (),
    collectives: Sequence[CollectiveStat] = (),
    events: Sequence[Event] = (),
    runs: Sequence[RunInfo] = (),
    models: Sequence[ModelInfo] = (),
    optimizers: Sequence[OptimizerInfo] = (),
    budget_bytes: int | None = None,
) -> Profile:
    """The ``Profile`` of one session's records (all ranks; one rank of interest is read).

    Memory and modules come from rank 0 (else the lowest rank that reported), as in the
    report's memory section: the peak is the ``MemorySample`` with the highest
    ``total_bytes``, modules are each name's latest ``ModuleStat``. Steps come from the lowest
    rank that has steps. The device capacity (the budget when none is given) is the
    ``device_spec`` event's ``memory_capacity``, else the first run's ``device.memory_capacity``.
    """
    rank = _rank_of_interest({s.rank for s in memory} | {m.rank for m in modules})
    samples = [s for s in memory if s.rank == rank]
    peak = max(samples, key=lambda s: s.total_bytes, default=None)
    categories_max = {c: max((s.categories.get(c, 0) for s in samples), default=0) for c in MEMORY_CATEGORIES}
    at_peak = {c: int(peak.categories.get(c, 0)) for c in MEMORY_CATEGORIES} if peak is not None else {}
    peak_bytes = peak.total_bytes if peak is not None else 0
    param_bytes = sum(m.parameter_bytes for m in models)
    missing = _missing_model_states(categories_max, completed_step=bool(steps), param_bytes=param_bytes,
                                    optimizers=[o.to_dict() for o in optimizers])
    if missing:
        # The measurement predates the first optimizer step (an OOM in step 0, say): the
        # steady state will also hold gradients and optimizer state, so plan for them.
        for category, extra in missing.items():
            at_peak[category] = at_peak.get(category, 0) + extra
        peak_bytes += sum(missing.values())
    oom = _oom(events, rank)
    first = _first_rank(models)
    rows, unreached = _latest_modules(modules, rank), []
    if oom and oom.get("phase") == "forward" and len(first) == 1:
        rows, unreached = extrapolate(rows, first[0].modules, oom.get("module"))
        _heaviest_first(rows)
    section = {
        "peak_bytes": peak_bytes,
        "categories_at_peak": at_peak,
        "categories_max": categories_max,
        "modules": rows,
        "oom": oom,
    }
    profile = profile_from_memory(section, steps, capacity_bytes=_record_capacity(runs, events),
                                  budget_bytes=budget_bytes)
    op_rank = min((o.rank for o in ops), default=0)
    comm_rank = min((c.rank for c in collectives), default=0)
    device = min(runs, key=lambda r: r.rank).device if runs else {}
    return replace(profile, unreached_modules=tuple(unreached), ops=tuple(o for o in ops if o.rank == op_rank),
                   collectives=tuple(c for c in collectives if c.rank == comm_rank),
                   comm=rank_comm(collectives, steps, comm_rank) if collectives else None,
                   world_size=max([r.world_size for r in runs] or [1]),
                   data_parallel=first[0].wrapper if first else None,
                   optimizer_count=sum(1 for o in optimizers if o.rank == (first[0].rank if first else 0)),
                   visible_devices=int(device.get("count") or 1), device_type=str(device.get("type") or "cpu"),
                   memory_timeline=tuple(samples),
                   host_link_bandwidth=_host_link(events),
                   pipeline=_pipeline(events),
                   device=_device(runs, events),
                   reserved_at_peak=peak.reserved_bytes if peak is not None else None,
                   allocated_at_peak=peak.allocated_bytes if peak is not None else None,
                   rank_phases=_rank_phases(steps),
                   step_times=_step_times(steps),
                   loaders=_loaders(events),
                   checkpoint_saves=tuple({**e.data, "rank": e.rank} for e in events if e.name == "checkpoint_save"))


def _device(runs: Sequence[RunInfo], events: Sequence[Event]) -> dict[str, Any]:
    """The lowest rank's last ``device_spec`` event data, else the lowest rank's run device."""
    specs = [e for e in events if e.name == "device_spec"]
    if specs:
        low = min(e.rank for e in specs)
        return dict([e for e in specs if e.rank == low][-1].data)
    for run in sorted(runs, key=lambda r: r.rank):
        return dict(run.device)
    return {}


def _rank_phases(steps: Sequence[StepSample]) -> dict[int, dict[str, float]]:
    """Median light-step time and phases per rank (deep steps when a rank has no light one)."""
    out: dict[int, dict[str, float]] = {}
    for rank in sorted({s.rank for s in steps}):
        mine = [s for s in steps if s.rank == rank]
        light = [s for s in mine if not s.deep] or mine
        row = {"time_s": statistics.median(s.time_s for s in light)}
        for key in sorted({k for s in light for k in s.phases}):
            value = _median([s.phases.get(key) for s in light])
            if value is not None:
                row[key] = value
        out[rank] = row
    return out


def _step_times(steps: Sequence[StepSample]) -> dict[int, tuple[float, float]]:
    low = min((s.rank for s in steps), default=0)
    return {s.index: (s.time_s, float(s.phases.get("data_s", 0.0))) for s in steps if s.rank == low}


def _loaders(events: Sequence[Event]) -> tuple[dict[str, Any], ...]:
    """The lowest rank's ``dataloader`` events, latest per loader index."""
    found = [e for e in events if e.name == "dataloader"]
    if not found:
        return ()
    low = min(e.rank for e in found)
    latest: dict[int, dict[str, Any]] = {}
    for event in found:
        if event.rank == low:
            latest[int(event.data.get("index", 0))] = dict(event.data)
    return tuple(latest[i] for i in sorted(latest))


def _rank_of_interest(ranks: set[int]) -> int | None:
    if not ranks:
        return None
    return 0 if 0 in ranks else min(ranks)


def _first_rank(models: Sequence[ModelInfo]) -> list[ModelInfo]:
    low = min((m.rank for m in models), default=0)
    return [m for m in models if m.rank == low]


def _latest_modules(stats: Sequence[ModuleStat], rank: int | None) -> list[dict[str, Any]]:
    """Each module's latest stat, heaviest activations first (the report's memory.modules order)."""
    latest: dict[str, ModuleStat] = {}
    for stat in stats:
        if stat.rank == rank and (stat.name not in latest or stat.step >= latest[stat.name].step):
            latest[stat.name] = stat
    return _heaviest_first([s.to_dict() for s in latest.values()])


def _heaviest_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Module rows in the report's memory.modules order, in place: heaviest activations first."""
    rows.sort(key=lambda r: (-r["activation_bytes"], r["name"]))
    return rows


def _oom(events: Sequence[Event], rank: int | None) -> dict[str, Any] | None:
    ooms = [e for e in events if e.name == "oom"]
    if not ooms:
        return None
    event = ([e for e in ooms if e.rank == rank] or ooms)[-1]
    return {"rank": event.rank, "step": event.step, **event.data}


def _pipeline(events: Sequence[Event]) -> dict[str, Any] | None:
    """The last ``pipeline_stages`` event's data while its split is in force (mode ``pipeline``)."""
    last = next((e for e in reversed(events) if e.name == "pipeline_stages"), None)
    return dict(last.data) if last is not None and last.data.get("mode") == "pipeline" else None


def _host_link(events: Sequence[Event]) -> float | None:
    """The lowest rank's ``device_spec`` host-link figure, when it is a real link's."""
    specs = [e for e in events if e.name == "device_spec"]
    if not specs:
        return None
    data = [e for e in specs if e.rank == min(s.rank for s in specs)][-1].data
    value = data.get("host_link_bandwidth")
    if data.get("host_link_source") in ("measured", "override") and isinstance(value, (int, float)) and value > 0:
        return float(value)
    return None


def _record_capacity(runs: Sequence[RunInfo], events: Sequence[Event]) -> int | None:
    specs = [e for e in events if e.name == "device_spec"]
    if specs:
        low = min(e.rank for e in specs)
        capacity = [e for e in specs if e.rank == low][-1].data.get("memory_capacity")
        if capacity:
            return int(capacity)
    for run in sorted(runs, key=lambda r: r.rank):
        if run.device.get("memory_capacity"):
            return int(run.device["memory_capacity"])
    return None


def profile_from_memory(
    memory: Mapping[str, Any],
    steps: Iterable[Any] = (),
    *,
    capacity_bytes: int | None = None,
    budget_bytes: int | None = None,
) -> Profile:
    """Build a ``Profile`` from the report's memory section and its steps (dicts or ``StepSample``s)."""
    step_dicts = [_as_dict(s) for s in steps]
    rank = min((int(s.get("rank", 0)) for s in step_dicts), default=0)
    step_dicts = [s for s in step_dicts if int(s.get("rank", 0)) == rank]
    # The baseline is an ordinary step: not deep-sampled, and not the warm-up step 0 (allocator,
    # thread pools and lazy init make it several times slower) unless nothing else exists yet.
    light = ([s for s in step_dicts if not s.get("deep") and int(s.get("index", 1)) > 0]
             or [s for s in step_dicts if not s.get("deep")] or step_dicts)
    modules = _aggregate_modules(memory.get("modules") or [])
    # On CUDA the step on the device's timeline: the host's time of a step after a synchronised
    # one counts its launches only (20 ms for 130 ms of kernels, an H200 GPT).
    step_time = _median([s.get("device_time_s") if s.get("device_time_s") is not None else s.get("time_s")
                         for s in light])
    phases = {}
    for key in ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s"):
        value = _median([(s.get("phases") or {}).get(key) for s in light])
        if value is not None:
            phases[key] = value
    budget = budget_bytes or memory.get("budget_bytes") or capacity_bytes
    return Profile(
        peak_bytes=int(memory.get("peak_bytes") or 0),
        budget_bytes=int(budget) if budget else None,
        categories_at_peak={k: int(v) for k, v in (memory.get("categories_at_peak") or {}).items()},
        categories_max={k: int(v) for k, v in (memory.get("categories_max") or {}).items()},
        modules=modules,
        step_time_s=step_time,
        phases=phases,
        oom=dict(memory["oom"]) if memory.get("oom") else None,
        time_scale=_time_scale(modules, step_dicts, phases.get("forward_s")),
        light_forward_s=light_forward(step_dicts),
        light_recompute_s=light_forward(step_dicts, "module_recompute_s"),
    )


def light_forward(steps: Sequence[dict[str, Any]], key: str = "module_forward_s") -> dict[str, float]:
    """Each module's median forward seconds over the light steps that timed it (step 0 left out
    while a later step timed it: its first calls pay one-off costs); with ``key`` another of the
    steps' per-module maps (``module_recompute_s``)."""
    timed = [s for s in steps if not s.get("deep") and s.get(key)]
    timed = [s for s in timed if int(s.get("index", 1)) > 0] or timed
    names = sorted({name for s in timed for name in s[key]})
    out = {}
    for name in names:
        value = _median([s[key].get(name) for s in timed])
        if value is not None:
            out[name] = value
    return out


_PER_CALL = ("calls", "live_calls", "call_activation_bytes", "call_input_bytes", "call_output_bytes")
_FREED = ("checkpoint_freed_bytes", "checkpoint_freed_late_bytes")


def _largest(values: Iterable[Any]) -> int | None:
    known = [int(v) for v in values if v is not None]
    return max(known) if known else None


def _aggregate_modules(rows: Sequence[Any]) -> tuple[ModuleProfile, ...]:
    """One entry per module name (lowest rank): largest byte counts, median times over deep steps."""
    dicts = [_as_dict(r) for r in rows]
    if not dicts:
        return ()
    rank = min(int(d.get("rank", 0)) for d in dicts)
    groups: dict[str, list[dict[str, Any]]] = {}
    for d in dicts:
        if int(d.get("rank", 0)) == rank:
            groups.setdefault(str(d.get("name", "")), []).append(d)
    out = []
    for name, group in groups.items():
        out.append(
            ModuleProfile(
                name=name,
                type=str(group[-1].get("type", "")),
                depth=int(group[-1].get("depth", name.count(".") + 1 if name else 0)),
                parameter_bytes=max(int(g.get("parameter_bytes") or 0) for g in group),
                activation_bytes=max(int(g.get("activation_bytes") or 0) for g in group),
                input_bytes=max(int(g.get("input_bytes") or 0) for g in group),
                output_bytes=max(int(g.get("output_bytes") or 0) for g in group),
                forward_s=_median([g.get("forward_s") for g in group]) or 0.0,
                backward_s=_median([g.get("backward_s") for g in group]) or 0.0,
                **{k: max(int(g.get(k) or 0) for g in group) for k in _PER_CALL},
                **{k: _largest(g.get(k) for g in group) for k in _FREED},
            )
        )
    return tuple(out)


def _time_scale(modules: Sequence[ModuleProfile], steps: list[dict[str, Any]], light_forward: float | None) -> float:
    """Ordinary-step forward time over the probed forward time, clamped to (0, 1].

    Module times come from deep steps, which run slower; the model's own
    forward time (module "") or the deep steps' forward phase gives the ratio.
    Never above 1: a probed module is not faster than an ordinary one.
    """
    if not light_forward:
        return 1.0
    root = next((m for m in modules if m.name == ""), None)
    probed = root.forward_s if root and root.forward_s > 0 else None
    if probed is None:
        probed = _median([(s.get("phases") or {}).get("forward_s") for s in steps if s.get("deep")])
    if not probed:
        return 1.0
    return max(1e-3, min(1.0, light_forward / probed))


def _capacity(report: Mapping[str, Any]) -> int | None:
    runs: list[Any] = []
    if isinstance(report.get("run"), Mapping):
        runs.append(report["run"])
    if isinstance(report.get("runs"), list):
        runs.extend(report["runs"])
    elif isinstance(report.get("runs"), Mapping):
        runs.extend(report["runs"].values())
    for run in runs:
        device = (run or {}).get("device") or {}
        if device.get("memory_capacity"):
            return int(device["memory_capacity"])
    return None


def _as_dict(item: Any) -> dict[str, Any]:
    if isinstance(item, Mapping):
        return dict(item)
    to_dict = getattr(item, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise ValueError(f"expected a dict or a record with to_dict(), got {type(item).__name__}")


def _median(values: Iterable[Any]) -> float | None:
    clean = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(clean) if clean else None
