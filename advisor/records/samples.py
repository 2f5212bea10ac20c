"""The records that cross process and package boundaries.

Pure standard library on purpose: the agent (training process) builds them,
the wire carries them as JSON, the store persists them, ``recommend/`` reads
them back without importing torch.

Every record is a frozen, keyword-only dataclass with a ``KIND`` tag. Times
are seconds (``float``), sizes are bytes (``int``), wall-clock stamps are
``time.time()`` seconds since the epoch unless a field says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter, methodcaller
from typing import Any, Callable, ClassVar, Iterable, Mapping

from advisor.records.jsonable import Record, column_json

MEMORY_CATEGORIES: tuple[str, ...] = (
    "parameter",
    "gradient",
    "optimizer_state",
    "activation",
    "temporary",
    "input",
    "other",
    "offloaded_host",  # host memory an offload remedy holds (advisor.records.host_memory): never a device budget's
)

PHASES: tuple[str, ...] = ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s")


# The span the agent wraps its own step-boundary work in when the script profiles itself
# (advisor/agent/hooks.py); the Kineto importer leaves spans with this prefix out of the step.
ADVISOR_SPAN_PREFIX = "advisor::"
BOUNDARY_SPAN = ADVISOR_SPAN_PREFIX + "step_boundary"


@dataclass(frozen=True, kw_only=True)
class RunInfo(Record):
    """One training process, sent once when its agent starts."""

    KIND: ClassVar[str] = "run"
    script: str
    argv: list[str]
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    pid: int = 0
    hostname: str = ""
    started_at: float = 0.0
    torch_version: str = ""
    python_version: str = ""
    # {"type": "cpu"|"cuda", "name": str, "index": int|None, "memory_capacity": int|None, ...}
    device: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # the agent's settings
    # torchrun's TORCHELASTIC_RESTART_COUNT: 0 for the first workers, n for the n-th restart
    # (``--max-restarts``); a restarted worker counts its steps from 0 again.
    restart_count: int = 0


@dataclass(frozen=True, kw_only=True)
class ModelInfo(Record):
    """A model discovered by the agent: the outermost module run outside backward."""

    KIND: ClassVar[str] = "model"
    rank: int = 0
    name: str  # class name of the unwrapped module
    wrapper: str | None = None  # "DistributedDataParallel", "FullyShardedDataParallel", ...
    # The model's name in the script (the variable or attribute holding it, else the class name
    # with _1, _2 ...); with several models it prefixes every module name ("netG.main.3").
    label: str | None = None
    label_source: str = ""  # "local", "attribute", "global" (a variable was found) or "class"
    parameter_count: int = 0
    parameter_bytes: int = 0
    trainable_parameter_count: int = 0
    # [{"name": "layers.0.attn", "type": "Attention", "parameter_bytes": int, "depth": int}]
    modules: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class OptimizerInfo(Record):
    """An optimizer discovered at its first step."""

    KIND: ClassVar[str] = "optimizer"
    rank: int = 0
    name: str  # class name, e.g. "AdamW"
    parameter_count: int = 0
    param_groups: list[dict[str, Any]] = field(default_factory=list)  # hyperparameters only
    label: str | None = None  # unique per process: the class name, then _1, _2 ...; keys StepSample.optimizer_s


@dataclass(frozen=True, kw_only=True)
class StepSample(Record):
    """One training step on one rank: one pass over the optimizers of the loop's period.
    The phases add up to ``time_s`` by construction."""

    KIND: ClassVar[str] = "step"
    index: int  # 0-based count of steps on this rank
    rank: int = 0
    end_time: float = 0.0  # wall clock at the step boundary
    time_s: float  # boundary to boundary, less eval_s
    # The objective whose gradient the step applied: the sum of the scalars backward() ran on
    # (a closure optimizer's first evaluation only); None if there were none.
    loss: float | None = None
    micro_batches: int = 0  # backward() calls in this step
    phases: dict[str, float] = field(default_factory=dict)  # keys: PHASES
    peak_memory_bytes: int | None = None  # allocator peak in this step, where measurable
    deep: bool = False  # whether deep probes ran on this step
    losses: list[float | None] | None = None  # each backward()'s scalar, in order (None: not finite, as loss)
    eval_s: float = 0.0  # top-level forwards under no_grad outside training (evaluation), not in time_s
    # What ended the step: "optimizer", or without optimizer steps "update", "zero_grad",
    # "forward", "data", "exit" (see docs/architecture.md).
    boundary: str = "optimizer"
    optimizer_s: dict[str, float] = field(default_factory=dict)  # seconds in each optimizer's step, by label
    # Forward seconds of each numbered module (a container's member, "blocks.3"), summed over the
    # step's training calls; only on the light steps the agent samples for it (light_timing_every),
    # empty on every other step. The recompute cost of checkpointing them (recommend/profile.py).
    module_forward_s: dict[str, float] = field(default_factory=dict)
    # On the same steps, what a checkpoint's recomputation of each of those modules runs: from the
    # call's start to its last saved tensor (PyTorch's checkpoint stops recomputing there), summed
    # over the calls; absent for a module whose saves were not seen (advisor/agent/block_timer.py).
    module_recompute_s: dict[str, float] = field(default_factory=dict)
    # CUDA: the step on the device's timeline, less eval_s: from an event recorded where the step
    # began to one at its boundary. The host's time_s counts kernel launches, not the kernels: a
    # step after a synchronised one read 20 ms of launches for 130 ms of kernels on an H200. None
    # off CUDA and for a step that ended at a snapshot rather than a boundary hook.
    device_time_s: float | None = None
    # The probes that deep-sampled this step ([] on a light step). The compute probe counts and
    # then times its ops on two steps of its own (beside the memory tracker, its counts and times
    # would include the tracker's dispatch-mode Python): such steps have no memory figures.
    deep_probes: list[str] = field(default_factory=list)


def ordinary_steps(samples: Iterable[Any], *, index: Callable[[Any], int] = attrgetter("index"),
                   deep: Callable[[Any], bool] = attrgetter("deep")) -> list[Any]:
    """The steps every "ordinary step" statistic reads (one rank's ``StepSample``s, or with
    ``index`` and ``deep`` accessors anything else: the checker's report steps): light (deep ones
    run the probes), not the warm-up step 0, and not a light step right after a deep one (it pays
    for the deep probes' teardown while the controller takes in their records: 1.3-3x an ordinary
    step on 2 cores). Each filter is dropped, last first, when it would leave nothing: then light
    ones after step 0, any after step 0 (the deep ones: the profiled steps), all."""
    samples = list(samples)
    deep_at = {index(s) for s in samples if deep(s)}
    later = [s for s in samples if not deep(s) and index(s) > 0]
    return ([s for s in later if index(s) - 1 not in deep_at] or later
            or [s for s in samples if index(s) > 0] or samples)


@dataclass(frozen=True, kw_only=True)
class MemorySample(Record):
    """Bytes by category at one instant of one rank."""

    KIND: ClassVar[str] = "memory"
    rank: int = 0
    step: int
    time: float  # seconds since the start of this step
    event: str = ""  # what happened: an op name, or a phase boundary such as "forward_start"
    module: str | None = None
    categories: dict[str, int] = field(default_factory=dict)  # keys: MEMORY_CATEGORIES
    total_bytes: int = 0
    op_bytes: int | None = None  # an op's sample: the bytes of its new storages, in total_bytes already
    # CUDA only: allocator view and NVML (None elsewhere)
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    device_used_bytes: int | None = None
    # A light sample that stands for this many light steps (the bucket its step is in, from
    # advisor.records.schedule.LIGHT_SAMPLES_FULL on): the one of largest total_bytes among them.
    steps_covered: int = 1


def max_by_category(samples: Iterable[MemorySample]) -> dict[str, int]:
    """Each category's highest bytes over ``samples`` (0 where none): the report's
    ``memory.categories_max`` and the profile's. One pass per category in C (a deep step of a
    5001-module model has 25,000 samples)."""
    held = [s.categories for s in samples]
    return {c: max(map(methodcaller("get", c, 0), held), default=0) for c in MEMORY_CATEGORIES}


@dataclass(frozen=True, kw_only=True)
class ModuleStat(Record):
    """One module on one deep-sampled step."""

    KIND: ClassVar[str] = "module"
    rank: int = 0
    step: int
    name: str  # qualified name inside its model ("" is the model itself)
    type: str = ""
    depth: int = 0
    parameter_bytes: int = 0
    activation_bytes: int = 0  # saved for backward, produced by this module (innermost)
    input_bytes: int = 0
    output_bytes: int = 0
    forward_s: float = 0.0
    backward_s: float = 0.0
    forward_flops: int = 0
    backward_flops: int = 0
    # Per forward call (the figures above sum every call of the step): grad-enabled calls, the
    # most of them live together (no backward between), and the largest figure of one call.
    calls: int = 0  # 0: not recorded (older sessions); read the totals as one call
    live_calls: int = 0
    call_activation_bytes: int = 0
    call_input_bytes: int = 0
    call_output_bytes: int = 0
    # What checkpointing this module alone frees while it waits for backward, and what it frees
    # only by its own backward (saved again after it); probes/memory/modules.py. None: not measured.
    checkpoint_freed_bytes: int | None = None
    checkpoint_freed_late_bytes: int | None = None


@dataclass(frozen=True, kw_only=True)
class OpStat(Record):
    """One operator signature (name, shapes, dtype) aggregated over a deep-sampled step."""

    KIND: ClassVar[str] = "op"
    rank: int = 0
    step: int
    name: str  # aten overload packet, e.g. "aten.mm"
    module: str = ""  # innermost module that ran it
    phase: str = "forward"  # "forward" | "backward" | "optimizer" | "other"
    input_shapes: list[list[int]] = field(default_factory=list)
    dtype: str = ""
    count: int = 0
    flops: int = 0
    bytes: int = 0
    time_s: float = 0.0
    # Timed inside the counting mode on the counted step itself (each op's own run, not slowed by
    # the mode's Python around it), not by the profiler on a step of its own: not to be scaled by
    # the deep step's slowdown.
    inline: bool = False


@dataclass(frozen=True, kw_only=True)
class CollectiveStat(Record):
    """One collective or point-to-point call (or an aggregate of identical ones)."""

    KIND: ClassVar[str] = "collective"
    rank: int = 0
    step: int
    op: str  # "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", ...
    group_size: int = 1
    # The global ranks of the call's group, for a group smaller than the world (None: the whole
    # world, or not recorded, as by agents before this field and most trace imports).
    group_ranks: list[int] | None = None
    bytes: int = 0
    dtype: str = ""
    count: int = 1
    start: float = 0.0  # wall clock
    time_s: float = 0.0
    exposed_s: float = 0.0
    wait_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ExitInfo(Record):
    """How a training process ended, sent by its agent just before it exits."""

    KIND: ClassVar[str] = "exit"
    rank: int = 0
    code: int = 0
    reason: str = ""  # "completed", "stopped after N steps", "exception", "sys.exit", ...
    exc_type: str | None = None
    message: str | None = None
    frame: dict[str, Any] | None = None  # {"file", "line", "function", "code"} in the user's code
    steps: int = 0


@dataclass(frozen=True, kw_only=True)
class Event(Record):
    """A free-form agent event (a warning, an OOM record, an apply result)."""

    KIND: ClassVar[str] = "event"
    rank: int = 0
    step: int | None = None
    name: str  # "warning", "oom", "apply_result", ...
    data: dict[str, Any] = field(default_factory=dict)


def rank_of_interest(ranks: Iterable[int]) -> int | None:
    """The rank a single-rank figure describes (the report's memory and op sections, the advice,
    ``advisor diff``): rank 0, else the lowest rank that reported; None when none did."""
    found = set(ranks)
    if not found:
        return None
    return 0 if 0 in found else min(found)


TABLE_ROWS = 2048  # rows per table: a memory sample's row is about 300 bytes of JSON, a frame holds 16 MiB
# The kinds a table may hold, by their KIND (the row's own ``rank`` and ``step`` are the table's).
TABLE_KINDS: dict[str, type[Record]] = {cls.KIND: cls for cls in (MemorySample, OpStat, ModuleStat)}
TABLE_SHARED = ("rank", "step")


@dataclass(frozen=True, kw_only=True)
class RecordTable(Record):
    """``rows`` records of kind ``of`` (a key of TABLE_KINDS) of one rank and step, as columns: a
    deep step's memory samples, op signatures and modules (advisor/records/table.py says why)."""

    KIND: ClassVar[str] = "table"
    rank: int = 0
    step: int
    of: str
    rows: int
    columns: dict[str, list[Any]] = field(default_factory=dict)  # field name -> a value per row

    def to_dict(self) -> dict[str, Any]:
        """The wire form: a column of plain values as it is (a table is never changed once made),
        any other converted once per distinct value (``column_json``)."""
        return {"rank": self.rank, "step": self.step, "of": self.of, "rows": self.rows,
                "columns": {str(name): column_json(values) for name, values in self.columns.items()}}

    def records(self) -> list[Record]:
        """The records the table stands for, in order (a field without a column takes its default)."""
        cls = TABLE_KINDS[self.of]
        names = list(self.columns)
        shared = {"rank": self.rank, "step": self.step}
        return [cls(**shared, **dict(zip(names, values))) for values in zip(*self.columns.values())] \
            if names else [cls(**shared) for _ in range(self.rows)]


RECORD_TYPES: dict[str, type[Record]] = {
    cls.KIND: cls
    for cls in (
        RunInfo,
        ModelInfo,
        OptimizerInfo,
        StepSample,
        MemorySample,
        ModuleStat,
        OpStat,
        CollectiveStat,
        ExitInfo,
        Event,
        RecordTable,
    )
}


def record_from_message(kind: str, data: Mapping[str, Any]) -> Record:
    """Rebuild a record from its wire form; raises ``ValueError`` for an unknown kind."""
    try:
        cls = RECORD_TYPES[kind]
    except KeyError:
        raise ValueError(f"unknown record kind {kind!r}; valid: {sorted(RECORD_TYPES)}") from None
    return cls.from_dict(data)
