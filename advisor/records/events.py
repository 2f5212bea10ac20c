"""Typed payloads of the agents' events: one frozen record per ``Event.name`` the controller or the
recommender reads.

An ``Event`` travels with ``data``, a JSON object (samples.py keeps that wire and store shape); its
payload is that object decoded, checked field by field, into the record below that has the event's
name: ``Oom.of(event)``, or ``payload(event)`` for whichever kind it is. The controller decodes once
at its edge (``advisor/intake.py``: an event whose payload does not decode is dropped there), so
readers take attributes, never ``data.get``. Emitters build the record and send
``payload.event(rank=, step=)``. Keys a newer agent adds are ignored; fields the readers do not need
yet stay in ``data`` (the report's memory section shows an OOM's whole record).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Mapping, Sequence

from advisor.records.checkpoint_saves import CHECKPOINT_APIS, CHECKPOINT_SAVES
from advisor.records.jsonable import Checked
from advisor.records.payload import P, Payload
from advisor.records.results import ApplyResult, ApplyStarted, RevertResult
from advisor.records.samples import Event


SAID_BY_ADVICE = "apply-decision"  # a warning the controller's advice loop printed on stderr as it stored it


@dataclass(frozen=True, kw_only=True)
class WarningEvent(Payload):
    """Something the user should read (``source``: which part said it, as "apply" or "restart";
    ``SAID_BY_ADVICE`` for the controller's --apply decisions, printed when made)."""

    NAME: ClassVar[str] = "warning"
    message: str = ""
    source: str | None = None


@dataclass(frozen=True, kw_only=True)
class Oom(Payload):
    """The job ran out of memory (``kind`` "cuda" or "error"), or an op would exceed an enforced
    budget ("budget"): the failed request and what was allocated when it failed (bytes)."""

    NAME: ClassVar[str] = "oom"
    kind: str = ""
    message: str = ""
    op: str | None = None
    module: str | None = None
    requested_bytes: int | None = None
    budget_bytes: int | None = None
    categories: dict[str, int] = field(default_factory=dict)  # MEMORY_CATEGORIES at the failure
    inferred_bytes: dict[str, int] = field(default_factory=dict)  # allocator bytes given to a category
    step: int | None = None
    phase: str | None = None  # "forward", "backward", "optimizer", ...
    allocated_bytes: int | None = None  # CUDA's allocator at the failure (None elsewhere)
    reserved_bytes: int | None = None
    rank: int = 0  # not on the wire: the event's rank, set by ``at_rank``

    def at_rank(self, event: Event) -> "Oom":
        """This OOM stamped with the rank and step of the event that carried it."""
        return replace(self, rank=event.rank, step=self.step if self.step is not None else event.step)


@dataclass(frozen=True, kw_only=True)
class ModuleActivations(Payload):
    """Activation bytes each module and its descendants saved, on one deep step."""

    NAME: ClassVar[str] = "module_activations"
    inclusive_bytes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class CudaMemory(Payload):
    """The CUDA caching allocator and NVML at the end of a deep step (bytes; None where unknown)."""

    NAME: ClassVar[str] = "cuda_memory"
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    device_used_bytes: int | None = None
    device_used_outside_torch_bytes: int | None = None
    device_total_used_bytes: int | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointSave(Payload):
    """The script saved captured state (``advisor/agent/saves.py``); read by the ZeRO predictor."""

    NAME: ClassVar[str] = "checkpoint_save"
    api: str
    saves: tuple[str, ...] = ()
    sharded: bool = False
    step: int | None = None
    rank: int = 0  # not on the wire: the event's rank (``Profile.checkpoint_saves`` spans ranks)

    def at_rank(self, event: Event) -> "CheckpointSave":
        """This save stamped with the rank of the event that carried it."""
        return replace(self, rank=event.rank)

    def __post_init__(self) -> None:
        if self.api not in CHECKPOINT_APIS:
            raise ValueError(f"api {self.api[:40]!r} is not one of {list(CHECKPOINT_APIS)}")
        if not set(self.saves) <= set(CHECKPOINT_SAVES):
            raise ValueError(f"saves {list(self.saves)} is not a subset of {list(CHECKPOINT_SAVES)}")


@dataclass(frozen=True, kw_only=True)
class DataLoaderSettings(Payload):
    """One of the script's DataLoaders as the agent captured it (and after a remedy changed it)."""

    NAME: ClassVar[str] = "dataloader"
    index: int = 0
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    batch_size: int | None = None
    sampler: str | None = None
    seeded: bool = False
    cpu_count: int = 1  # CPUs the training process may run on


@dataclass(frozen=True, kw_only=True)
class CollectiveCall(Checked):
    """One collective as its rank issued it: op, process group and the group's call count (``seq``),
    and its start (``time.time()``): what matches the same call across ranks."""

    op: str
    group: str = ""
    seq: int = 0
    start: float = 0.0


@dataclass(frozen=True, kw_only=True)
class CollectiveSeq(Payload):
    """The collectives one rank issued in one step, in order (the comm probe, and imported traces)."""

    NAME: ClassVar[str] = "collective_seq"
    calls: tuple[CollectiveCall, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DeviceSpec(Payload):
    """A device's ceilings and how they were found (``advisor/probes/device/spec.py`` measures them).

    FLOP/s per dtype key ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8"), bandwidth in bytes/s,
    capacity in bytes. The host link (pinned host<->device copies, bytes/s) rides along for the
    offload remedies; ``count``: devices one process sees (a run's device, not the event's)."""

    NAME: ClassVar[str] = "device_spec"
    type: str = ""  # "cpu" | "cuda"
    name: str = ""
    index: int | None = None
    driver: str | None = None
    peak_flops: dict[str, float] = field(default_factory=dict)  # the values in use
    memory_bandwidth: float | None = None
    memory_capacity: int | None = None
    source: str = "spec"  # where the values in use came from: "spec", "measured" or "override"
    part: str | None = None  # the spec-table entry matched
    spec_peak_flops: dict[str, float] = field(default_factory=dict)
    spec_memory_bandwidth: float | None = None
    measured_peak_flops: dict[str, float] = field(default_factory=dict)
    measured_memory_bandwidth: float | None = None
    host_link_bandwidth: float | None = None
    host_link_source: str | None = None  # "measured", "override", "assumed" or "unknown: ..."
    count: int = 1


@dataclass(frozen=True, kw_only=True)
class PipelineStages(Payload):
    """The live in-process pipeline split (``apply/remedies/pipeline.py``), with each stage's
    measured forward seconds per pipelined forward; ``mode`` "pipeline" while it is in force."""

    NAME: ClassVar[str] = "pipeline_stages"
    stages: tuple[tuple[str, ...], ...] = ()
    devices: tuple[str, ...] = ()
    micro_batches: int = 1
    mode: str = ""
    refusal: str | None = None
    pipelined_forwards: int = 0
    stage_times_s: tuple[float, ...] = ()
    previous_stages: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True, kw_only=True)
class DeepSamplingStopped(Payload):
    """A deep step was so much slower than the light ones that scheduled deep sampling ended."""

    NAME: ClassVar[str] = "deep_sampling_stopped"
    step: int = 0
    deep_s: float = 0.0
    light_s: float = 0.0
    slowdown: float | None = None
    limit_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class DeepProbesLeftOff(Payload):
    """Probes that did not deep-sample this job, and why (``"compiled model"``: their dispatch modes
    would run a torch.compile'd model outside its compiled code; ``--deep-compiled`` lets them)."""

    NAME: ClassVar[str] = "deep_probes_left_off"
    probes: tuple[str, ...] = ()
    reason: str = ""
    step: int = 0


@dataclass(frozen=True, kw_only=True)
class RemedyChecks(Payload):
    """Each remedy's refusals for this rank's job, from its ``check_<name>`` in the training process
    (advisor/apply/registry.py): {remedy: {params key: why}}, the key "" for any params and
    ``"stage=2"`` for one value of one param; {} where the remedy can apply."""

    NAME: ClassVar[str] = "remedy_checks"
    checks: dict[str, dict[str, str]] = field(default_factory=dict)

    def refusal(self, remedy: str, params: Mapping[str, Any]) -> str | None:
        """Why ``remedy`` with ``params`` cannot apply here, or None."""
        for key, why in (self.checks.get(remedy) or {}).items():
            name, _, value = key.partition("=")
            if not key or str(params.get(name)) == value:
                return why
        return None


@dataclass(frozen=True, kw_only=True)
class CheckpointTrial(Payload):
    """What checkpointing one module of each type cost, measured on a copy of it between steps
    (advisor/agent/checkpoint_trial.py): {type name: {"module", "forward_s", "plain_s",
    "checkpoint_s", "ratio", "reps"}}; ``ratio`` = (checkpointed - plain forward and backward) /
    plain forward."""

    NAME: ClassVar[str] = "checkpoint_trial"
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)

    def added(self) -> dict[str, tuple[str, float]]:
        """type name -> (the module tried, seconds checkpointing added to its forward and
        backward), for the entries whose figures are finite numbers."""
        out = {}
        for kind, f in self.modules.items():
            if not isinstance(f, Mapping) or not isinstance(f.get("module"), str):
                continue
            ck, plain = f.get("checkpoint_s"), f.get("plain_s")
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf") for v in (ck, plain)):
                out[kind] = (f["module"], max(0.0, float(ck) - float(plain)))
        return out

    def ratios(self) -> dict[str, float]:
        """type name -> ratio, for the entries whose ratio is a finite number >= 0."""
        out = {}
        for kind, figures in self.modules.items():
            ratio = figures.get("ratio") if isinstance(figures, Mapping) else None
            if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 <= ratio < float("inf"):
                out[kind] = float(ratio)
        return out


@dataclass(frozen=True, kw_only=True)
class Job(Payload):
    """The token rank 0 drew for this run of a multi-node job (``advisor/agent/relay.py``)."""

    NAME: ClassVar[str] = "job"
    token: str
    world_size: int = 1


@dataclass(frozen=True, kw_only=True)
class PeerLost(Payload):
    """Ranks whose heartbeat stopped (``silent_s`` seconds without a beat)."""

    NAME: ClassVar[str] = "peer_lost"
    ranks: tuple[int, ...] = ()
    message: str = ""
    silent_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class PeerExit(Payload):
    """A peer rank wrote a non-zero exit code."""

    NAME: ClassVar[str] = "peer_exit"
    ranks: tuple[int, ...] = ()
    code: int = 0
    message: str = ""


# Every payload by event name (the apply outcomes are results.py's).
PAYLOADS: dict[str, type[Payload]] = {cls.NAME: cls for cls in (
    WarningEvent, Oom, ModuleActivations, CudaMemory, CheckpointSave, DataLoaderSettings, DeviceSpec, PipelineStages,
    DeepSamplingStopped, DeepProbesLeftOff, RemedyChecks, CollectiveSeq, Job, PeerLost, PeerExit, ApplyResult, ApplyStarted, RevertResult)}


def payload(event: Event) -> Payload | None:
    """The typed payload of ``event``, None for a name with none; ``ValueError`` naming the field
    when its data does not fit."""
    cls = PAYLOADS.get(event.name)
    return None if cls is None else cls.of(event)


def warnings_of(events: Sequence[Event]) -> list[str]:
    """The messages of the ``warning`` events, in order (the report's ``warnings``)."""
    return [w.message for _, w in payloads(events, WarningEvent)]


def payloads(events: Sequence[Event], cls: type[P]) -> list[tuple[Event, P]]:
    """Each event named ``cls.NAME`` with its payload, in order."""
    return [(e, cls.of(e)) for e in events if e.name == cls.NAME]
