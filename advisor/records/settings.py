"""The agent's settings as they cross the process boundary (``ADVISOR_CONFIG``, JSON).

Torch-free. The controller builds one ``AgentSettings`` from the command line
(``advisor.cli.agent_settings``), adds what only the session knows (``--steps``, a multi-node
job's relay: ``Session.environment``) and encodes it once (``encode_settings``); the training
process decodes it once (``decode_settings``, in ``advisor.agent.bootstrap``), and every part of
the agent, the probes and the executor read typed attributes from then on.

The JSON form is the fields by name, as the dict it replaced: a key this version does not know is
ignored with a warning (an older or newer controller), a value of the wrong type is refused with
a one-line message naming the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from advisor.records.fit import FitSettings
from advisor.records.jsonable import decode_checked, to_json
from advisor.records.schedule import DEEP_STEPS, LIGHT_TIMING_EVERY

# The probes an agent can run, in the order it starts their deep sampling (it stops them in reverse).
PROBE_NAMES: tuple[str, ...] = ("memory", "compute", "comm")

HOLD_S = 60.0  # the longest a job waits at a boundary for the controller's decision on an apply
AGREE_TIMEOUT_S = 60.0  # a keep/revert vote across ranks that takes longer reverts (apply.agreement)
TIME_MARGIN = 0.25  # an applied remedy may be this much slower than its reference and still be kept
RELAY_TIMEOUT_S = 1800.0  # torch's default for a gloo process group (the command relay's own group)


class SettingsError(ValueError):
    """Settings the training process cannot run with; the message names the key."""


def probe_names(value: str | None) -> list[str]:
    """Parse ``--probes memory,compute`` ("all" and "none" allowed); ValueError names valid ones."""
    if value is None or value == "all":
        return list(PROBE_NAMES)
    if value == "none":
        return []
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROBE_NAMES]
    if unknown:
        raise ValueError(f"unknown probe(s) {', '.join(unknown)}; valid: {', '.join(PROBE_NAMES)}, all, none")
    return names


def _not_negative(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if value is not None and (value < 0 or (isinstance(value, float) and not math.isfinite(value))):
            raise ValueError(f"{name} must be a number >= 0, got {value}")


@dataclass(frozen=True, kw_only=True)
class MultinodeSettings:
    """What every agent of a multi-controller job is told (``MultiNode.agent_settings``): rank 0's
    controller decides, the others' commands are ignored, peers are watched
    (``advisor/agent/relay.py``). No flag: the controller sets it for a multi-node attach."""

    relay: bool = True  # rank 0's commands reach every rank through the job's process group
    heartbeat_s: float = 1.0  # how often each rank bumps its counter in the job's store
    lost_after_s: float = 10.0  # a counter that did not move for this long is a peer lost
    timeout_s: float = RELAY_TIMEOUT_S  # the relay's gloo group waits as long as the job's own would

    def __post_init__(self) -> None:
        _not_negative(self, "heartbeat_s", "lost_after_s", "timeout_s")


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """Everything the training process's agent reads, with its ``advisor attach`` flag; a field
    without a flag is a tuning knob with the documented default (tests and benchmarks set them)."""

    # -- from the command line
    probes: tuple[str, ...] = PROBE_NAMES  # --probes (default all)
    deep_steps: tuple[int, ...] = DEEP_STEPS  # --deep-steps (default 1,2,3)
    deep_every: int = 100  # --deep-every N: every N-th step is deep too (0: never)
    max_steps: int | None = None  # --steps N: stop cleanly after N steps (set by Session.environment)
    memory_budget_bytes: int | None = None  # --memory-budget SIZE
    enforce_budget: bool = False  # --enforce-budget: an allocation over the budget raises OOM
    peak_flops: float | None = None  # --peak-flops: overrides the device's measured FLOP/s
    peak_bandwidth: float | None = None  # --peak-bandwidth: overrides its memory bandwidth (B/s)
    host_link_bandwidth: float | None = None  # --host-link-bandwidth: overrides the host link (B/s)
    deep_compiled: bool = False  # --deep-compiled: dispatch-mode probes deep-sample torch.compile'd models too
    allow_inexact: bool = False  # --allow-inexact: live-opt-in remedies may apply without the TUI's consent
    apply_hold_step: int | None = None  # --apply-at-step K (with --apply): wait at the boundary before K
    plan: str | None = None  # --plan FILE (absolute): remedies applied before the first step
    # --plan FILE's environment (restart remedies). Not read by the agent: the controller sets it in
    # the training process's environment (Session.environment), and the run's record keeps it.
    plan_env: dict[str, str] = field(default_factory=dict)
    # -- set by the controller of a multi-node job
    multinode: MultinodeSettings | None = None
    # -- set by `advisor fit`: the script runs on fake tensors for this target and world
    # (advisor/fit/); the device's ceilings come from the spec table, never measured on it
    fit: FitSettings | None = None
    # -- no flag: tuning knobs
    apply_hold_s: float = HOLD_S  # the longest wait for the decision at apply_hold_step
    apply_agree_timeout_s: float = AGREE_TIMEOUT_S  # the cross-rank keep/revert vote's timeout
    apply_time_margin: float = TIME_MARGIN  # tolerated slowdown of a kept remedy beyond its reference
    light_timing_every: int = LIGHT_TIMING_EVERY  # one light step in N times its blocks' forward (0: never)
    deep_max_slowdown: float = 20.0  # a deep step this many light steps long ends scheduled deep sampling...
    deep_min_s: float = 30.0  # ...when it is longer than this too
    # DDP objects get the delegating communication hook when built (gradient compression switches it
    # later); False leaves DDP's built-in all-reduce alone, and gradient compression unavailable.
    comm_switch: bool = True

    def __post_init__(self) -> None:
        unknown = [n for n in self.probes if n not in PROBE_NAMES]
        if unknown:
            raise ValueError(f"probes: unknown {', '.join(unknown)} (valid: {', '.join(PROBE_NAMES)})")
        if any(step < 0 for step in self.deep_steps):
            raise ValueError(f"deep_steps must be step indices >= 0, got {list(self.deep_steps)}")
        _not_negative(self, "deep_every", "max_steps", "memory_budget_bytes", "peak_flops", "peak_bandwidth",
                      "host_link_bandwidth", "apply_hold_step", "apply_hold_s", "apply_agree_timeout_s",
                      "apply_time_margin", "light_timing_every", "deep_max_slowdown", "deep_min_s")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``ADVISOR_CONFIG``, and ``RunInfo.config`` in the session)."""
        return to_json(self)  # type: ignore[no-any-return]


def encode_settings(settings: AgentSettings) -> str:
    """The ``ADVISOR_CONFIG`` value for ``settings``."""
    return json.dumps(settings.to_dict(), allow_nan=False)


def decode_settings(text: str | None) -> tuple[AgentSettings, list[str]]:
    """``ADVISOR_CONFIG`` -> (the settings, one warning per key this version does not know).
    Empty or missing: the defaults. ``SettingsError`` when it is not a JSON object or a value is
    of the wrong type, naming the key."""
    try:
        data = json.loads(text) if text else {}
        settings, unknown = decode_checked(AgentSettings, data, where="ADVISOR_CONFIG")
    except json.JSONDecodeError as exc:
        raise SettingsError(f"ADVISOR_CONFIG is not JSON: {exc}") from None
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    warnings = [f"agent setting {key!r} ignored: this version of the agent does not know it "
                "(is the controller another version?)" for key in unknown]
    return settings, warnings
