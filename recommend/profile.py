"""The typed data the recommender reads, built from a session's records.

``profile_from_records(...)`` is the one path from records to a ``Profile``: the
live advice loop, ``advisor report``, ``advisor plan`` and ``bench/prediction.py``
all pass it the typed records (steps, memory samples, module stats, op stats,
collectives, events) of the regime being advised, so a rule sees the same data
wherever it runs. Events are read through their typed payloads
(``advisor/records/events.py``). Nothing here imports torch: any saved session can
be re-advised.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from advisor.recommend.comm import RankComm, rank_comm
from advisor.recommend.unreached import extrapolate
from advisor.records.events import (CheckpointSave, CheckpointTrial, DataLoaderSettings, DeviceSpec, Oom, PipelineStages, RemedyChecks,
                                     payloads)
from advisor.records.samples import (
    MEMORY_CATEGORIES,
    PHASES,
    CollectiveStat,
    Event,
    MemorySample,
    ModelInfo,
    ModuleStat,
    OpStat,
    OptimizerInfo,
    RunInfo,
    StepSample,
    max_by_category,
    ordinary_steps,
    rank_of_interest,
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

    @classmethod
    def of(cls, stat: ModuleStat) -> "ModuleProfile":
        return cls(name=stat.name, type=stat.type, depth=stat.depth, parameter_bytes=stat.parameter_bytes,
                   activation_bytes=stat.activation_bytes, input_bytes=stat.input_bytes,
                   output_bytes=stat.output_bytes, forward_s=stat.forward_s, backward_s=stat.backward_s,
                   calls=stat.calls, live_calls=stat.live_calls, call_activation_bytes=stat.call_activation_bytes,
                   call_input_bytes=stat.call_input_bytes, call_output_bytes=stat.call_output_bytes,
                   checkpoint_freed_bytes=stat.checkpoint_freed_bytes,
                   checkpoint_freed_late_bytes=stat.checkpoint_freed_late_bytes)


@dataclass(frozen=True, kw_only=True)
class RankPhases:
    """One rank's median light-step time and phases (seconds; keys of ``PHASES``): the straggler's."""

    time_s: float
    phases: dict[str, float] = field(default_factory=dict)


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
    oom: Oom | None = None  # the last OOM of the rank of interest (else of any rank)
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
    # (its stage_times_s: measured forward seconds per stage); None when no split is in force.
    # Read by the repartition rule (remedies/pipeline_repartition.py).
    pipeline: PipelineStages | None = None
    # Read by the bottleneck rules (recommend/rules, recommend/remedies). ``device``: the lowest
    # rank's ``device_spec`` event, else the lowest rank's run device (no ceilings then).
    device: DeviceSpec = field(default_factory=DeviceSpec)
    # CUDA caching allocator at the peak sample (bytes; None off CUDA): reserved - allocated is
    # the cache the allocator holds but no tensor uses (fragmentation's evidence).
    reserved_at_peak: int | None = None
    allocated_at_peak: int | None = None
    # Each rank's median light-step time and phases: the straggler.
    rank_phases: dict[int, RankPhases] = field(default_factory=dict)
    # Every step of the lowest rank with steps: index -> (time_s, data_s), deep and light (rules
    # that compare deep-step measurements, such as op times, with the steps they came from).
    step_times: dict[int, tuple[float, float]] = field(default_factory=dict)
    # The script's DataLoaders as the agent captured them (the lowest rank's, latest per loader).
    loaders: tuple[DataLoaderSettings, ...] = ()
    # The script's own checkpoint saves of captured state (every rank, in arrival order, each with
    # its event's rank). Read by the ZeRO predictor.
    checkpoint_saves: tuple[CheckpointSave, ...] = ()
    # Each rank's latest answers of the remedies' checks in the training process (``remedy_checks``
    # events): what a remedy cannot do to this job. Empty for a session recorded before them.
    remedy_checks: tuple[RemedyChecks, ...] = ()
    # Module type -> what checkpointing one of that type added, over its plain forward, measured on
    # a copy between steps (``CheckpointTrial``, the lowest rank's latest); recompute_seconds reads it.
    checkpoint_ratio: dict[str, float] = field(default_factory=dict)
    # The same trials' module tried and the seconds checkpointing added to it, by type.
    checkpoint_added: dict[str, tuple[str, float]] = field(default_factory=dict)

    def refusal(self, remedy: str, params: Mapping[str, Any]) -> str | None:
        """Why ``remedy`` with ``params`` cannot apply to this job on some rank, or None."""
        return next((why for checks in self.remedy_checks if (why := checks.refusal(remedy, params))), None)

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
        """The modules whose nearest measured ancestor is ``name``, in the profile's order (an
        index built once: a scan of every module per call was quadratic, 37 s of a report at
        5001 modules)."""
        index = self.__dict__.get("_cache_children")
        if index is None:
            index = {}
            for m in self.modules:
                parent = self.parent(m.name)
                if parent is not None and m.name != parent:
                    index.setdefault(parent, []).append(m)
            object.__setattr__(self, "_cache_children", index)  # frozen: cache outside the fields
        return list(index.get(name, ()))

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


# Optimizer state per parameter byte in steady state (REFERENCE.md: Adam keeps exp_avg and exp_avg_sq).
_STATE_FACTOR = {"Adam": 2.0, "AdamW": 2.0, "NAdam": 2.0, "RAdam": 2.0, "Adamax": 2.0, "Adagrad": 1.0,
                 "RMSprop": 1.0, "Adadelta": 2.0, "Rprop": 2.0, "ASGD": 2.0}


def missing_model_states(seen: dict[str, int], *, completed_step: bool, param_bytes: int,
                         optimizers: Sequence[OptimizerInfo]) -> dict[str, int]:
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
        for opt in optimizers or [OptimizerInfo(name="unknown")]:
            if opt.name == "SGD":
                groups = opt.param_groups or [{}]
                factor = max(factor, 1.0 if any(g.get("momentum") for g in groups) else 0.0)
            else:
                factor = max(factor, _STATE_FACTOR.get(opt.name, 2.0))
        if factor:
            missing["optimizer_state"] = int(param_bytes * factor)
    return missing


def has_measurements(*, steps: Sequence[StepSample], modules: Sequence[ModuleStat],
                     events: Sequence[Event]) -> bool:
    """Whether there is anything to advise on (an OOM before the first step still counts)."""
    return bool(steps) or bool(modules) or any(e.name == Oom.NAME for e in events)


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
    rank = rank_of_interest({s.rank for s in memory} | {m.rank for m in modules})
    samples = [s for s in memory if s.rank == rank]
    peak = max(samples, key=lambda s: s.total_bytes, default=None)
    categories_max = max_by_category(samples)
    at_peak = {c: int(peak.categories.get(c, 0)) for c in MEMORY_CATEGORIES} if peak is not None else {}
    peak_bytes = peak.total_bytes if peak is not None else 0
    missing = missing_model_states(categories_max, completed_step=bool(steps),
                                   param_bytes=sum(m.parameter_bytes for m in models), optimizers=optimizers)
    if missing:
        # The measurement predates the first optimizer step (an OOM in step 0, say): the
        # steady state will also hold gradients and optimizer state, so plan for them.
        for category, extra in missing.items():
            at_peak[category] = at_peak.get(category, 0) + extra
        peak_bytes += sum(missing.values())
    oom = _oom(events, rank)
    first = _first_rank(models)
    stats, unreached = _latest_modules(modules, rank), []
    if oom is not None and oom.phase == "forward" and len(first) == 1:
        stats, unreached = extrapolate(stats, first[0].modules, oom.module)
    rows = tuple(ModuleProfile.of(s) for s in sorted(stats, key=lambda s: (-s.activation_bytes, s.name)))
    own = _own_steps(steps)
    light = ordinary_steps(own)
    phases = {key: value for key in PHASES if (value := _median([s.phases.get(key) for s in light])) is not None}
    device = _device(runs, events)
    run_device = _run_device(runs)
    capacity = device.memory_capacity or _run_capacity(runs)
    budget = budget_bytes or capacity
    op_rank = min((o.rank for o in ops), default=0)
    comm_rank = min((c.rank for c in collectives), default=0)
    return Profile(
        peak_bytes=peak_bytes,
        budget_bytes=int(budget) if budget else None,
        categories_at_peak=at_peak,
        categories_max=categories_max,
        modules=rows,
        # On CUDA the step on the device's timeline: the host's time of a step after a synchronised
        # one counts its launches only (20 ms for 130 ms of kernels, an H200 GPT).
        step_time_s=_median([s.device_time_s if s.device_time_s is not None else s.time_s for s in light]),
        phases=phases,
        oom=oom,
        unreached_modules=tuple(unreached),
        time_scale=_time_scale(rows, own, phases.get("forward_s")),
        light_forward_s=light_forward(own, "module_forward_s"),
        light_recompute_s=light_forward(own, "module_recompute_s"),
        ops=tuple(o for o in ops if o.rank == op_rank),
        collectives=tuple(c for c in collectives if c.rank == comm_rank),
        comm=rank_comm(collectives, steps, comm_rank) if collectives else None,
        world_size=max([r.world_size for r in runs] or [1]),
        data_parallel=first[0].wrapper if first else None,
        optimizer_count=sum(1 for o in optimizers if o.rank == (first[0].rank if first else 0)),
        visible_devices=run_device.count, device_type=run_device.type or "cpu",
        memory_timeline=tuple(samples),
        host_link_bandwidth=_host_link(device),
        pipeline=_pipeline(events),
        device=device,
        reserved_at_peak=peak.reserved_bytes if peak is not None else None,
        allocated_at_peak=peak.allocated_bytes if peak is not None else None,
        rank_phases=_rank_phases(steps),
        step_times=_step_times(steps),
        loaders=_loaders(events),
        checkpoint_saves=tuple(s.at_rank(e) for e, s in payloads(events, CheckpointSave)),
        remedy_checks=tuple({e.rank: c for e, c in payloads(events, RemedyChecks)}.values()),
        checkpoint_ratio=_checkpoint_trials(events, "ratios"),
        checkpoint_added=_checkpoint_trials(events, "added"),
    )


def _own_steps(steps: Sequence[StepSample]) -> list[StepSample]:
    """The steps of the lowest rank that has any (the baseline's)."""
    low = min((s.rank for s in steps), default=0)
    return [s for s in steps if s.rank == low]


def _device(runs: Sequence[RunInfo], events: Sequence[Event]) -> DeviceSpec:
    """The lowest rank's last ``device_spec`` event, else the lowest rank's run device."""
    specs = payloads(events, DeviceSpec)
    if specs:
        low = min(e.rank for e, _ in specs)
        return [spec for e, spec in specs if e.rank == low][-1]
    return _run_device(runs)


def _run_device(runs: Sequence[RunInfo]) -> DeviceSpec:
    """The lowest rank's ``RunInfo.device`` (type, name, capacity, the devices it sees)."""
    for run in sorted(runs, key=lambda r: r.rank):
        try:
            return DeviceSpec.from_dict(run.device)
        except ValueError:  # a run record's free-form device that does not fit: no device figures
            return DeviceSpec()
    return DeviceSpec()


def _run_capacity(runs: Sequence[RunInfo]) -> int | None:
    """The first run (by rank) whose device says its capacity."""
    for run in sorted(runs, key=lambda r: r.rank):
        capacity = run.device.get("memory_capacity")
        if isinstance(capacity, int) and capacity > 0:
            return capacity
    return None


def _rank_phases(steps: Sequence[StepSample]) -> dict[int, RankPhases]:
    """Median ordinary-step time and phases per rank (``ordinary_steps``' light ones); a rank with
    no light step after step 0 has none. Step 0 (the optimizer's lazy state, first calls) and the
    deep steps (the probes' work, which differs by rank) are not the rank's own work: a 2-rank job
    was called a straggler from steps 0-3 alone, "1.62x, 4.21 ms more in optimizer", step 0's."""
    out: dict[int, RankPhases] = {}
    for rank in sorted({s.rank for s in steps}):
        light = [s for s in ordinary_steps([s for s in steps if s.rank == rank]) if not s.deep and s.index > 0]
        if not light:
            continue
        phases = {key: value for key in sorted({k for s in light for k in s.phases})
                  if (value := _median([s.phases.get(key) for s in light])) is not None}
        out[rank] = RankPhases(time_s=statistics.median(s.time_s for s in light), phases=phases)
    return out


def _step_times(steps: Sequence[StepSample]) -> dict[int, tuple[float, float]]:
    return {s.index: (s.time_s, float(s.phases.get("data_s", 0.0))) for s in _own_steps(steps)}


def _loaders(events: Sequence[Event]) -> tuple[DataLoaderSettings, ...]:
    """The lowest rank's ``dataloader`` events, latest per loader index."""
    found = payloads(events, DataLoaderSettings)
    if not found:
        return ()
    low = min(e.rank for e, _ in found)
    latest = {loader.index: loader for e, loader in found if e.rank == low}
    return tuple(latest[i] for i in sorted(latest))


def _checkpoint_trials(events: Sequence[Event], figure: str) -> dict[str, Any]:
    """The lowest rank's checkpoint trials' ``figure`` (``CheckpointTrial.ratios`` or ``added``),
    later ones over earlier ones, by module type."""
    found = payloads(events, CheckpointTrial)
    if not found:
        return {}
    low = min(e.rank for e, _ in found)
    out: dict[str, Any] = {}
    for e, trial in found:
        if e.rank == low:
            out.update(getattr(trial, figure)())
    return out


def _first_rank(models: Sequence[ModelInfo]) -> list[ModelInfo]:
    low = min((m.rank for m in models), default=0)
    return [m for m in models if m.rank == low]


def _latest_modules(stats: Sequence[ModuleStat], rank: int | None) -> list[ModuleStat]:
    """Each module's latest stat on ``rank``."""
    latest: dict[str, ModuleStat] = {}
    for stat in stats:
        if stat.rank == rank and (stat.name not in latest or stat.step >= latest[stat.name].step):
            latest[stat.name] = stat
    return list(latest.values())


def _oom(events: Sequence[Event], rank: int | None) -> Oom | None:
    """The last OOM of ``rank``, else of any rank, stamped with its event's rank and step."""
    ooms = payloads(events, Oom)
    if not ooms:
        return None
    event, oom = ([pair for pair in ooms if pair[0].rank == rank] or ooms)[-1]
    return oom.at_rank(event)


def _pipeline(events: Sequence[Event]) -> PipelineStages | None:
    """The last ``pipeline_stages`` event while its split is in force (mode ``pipeline``)."""
    found = payloads(events, PipelineStages)
    return found[-1][1] if found and found[-1][1].mode == "pipeline" else None


def _host_link(device: DeviceSpec) -> float | None:
    """The device's host-link figure, when it is a real link's (measured or given by the user)."""
    value = device.host_link_bandwidth
    if device.host_link_source in ("measured", "override") and value is not None and value > 0:
        return value
    return None


def light_forward(steps: Sequence[StepSample], key: str) -> dict[str, float]:
    """Each module's median seconds in the steps' per-module map ``key`` (``module_forward_s``, or
    ``module_recompute_s``) over the light steps that timed it (step 0 left out while a later step
    timed it: its first calls pay one-off costs), each timed step's figure taken at the speed of an
    ordinary one (``_at_ordinary_speed``)."""
    timed = [s for s in steps if not s.deep and getattr(s, key)]
    timed = [s for s in timed if s.index > 0] or timed
    forward = _median([s.phases.get("forward_s") for s in ordinary_steps(steps)])
    names = sorted({name for s in timed for name in getattr(s, key)})
    out = {}
    for name in names:
        value = _median([_at_ordinary_speed(s, getattr(s, key).get(name), forward) for s in timed])
        if value is not None:
            out[name] = value
    return out


def _at_ordinary_speed(step: StepSample, seconds: Any, forward: float | None) -> Any:
    """A module's host-timed seconds on ``step`` scaled by the ordinary steps' median forward
    phase over ``step``'s own: one timed step in five is a handful of steps, and on a loaded or
    warming machine its whole forward ran 1.3-3x an ordinary one (hf_clm's forward sped up 35%
    between steps 4 and 9; the zoo's FSDP2 step after deep ones 3x): the block's time scaled with
    it and priced a checkpoint's recompute that much over what it cost. The scale keeps each
    block's share of its step's forward. CUDA times (``device_time_s``: timing events on the
    stream) and steps without a forward phase are taken as they are; the host's forward phase
    there counts launches."""
    own = step.phases.get("forward_s")
    if (forward is None or step.device_time_s is not None or not isinstance(seconds, (int, float))
            or not isinstance(own, (int, float)) or own <= 0):
        return seconds
    return seconds * forward / own


def _time_scale(modules: Sequence[ModuleProfile], steps: Sequence[StepSample], light_forward: float | None) -> float:
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
        probed = _median([s.phases.get("forward_s") for s in steps if s.deep])
    if not probed:
        return 1.0
    return max(1e-3, min(1.0, light_forward / probed))


def _median(values: Iterable[Any]) -> float | None:
    clean = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(clean) if clean else None
