"""The probes an agent runs, and the one way it calls them.

Every probe hook is called with the agent's context (``advisor.records.context.AgentContext``).
A probe that raises is disabled and reported once as a warning: a probe never breaks training,
except for the out-of-memory error an enforced budget asks a probe to raise, and the end of
training it may signal.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from advisor.probes.probe import Probe
from advisor.records.context import AgentContext


class ProbeSet:
    """The probes in their start order (deep sampling stops in reverse)."""

    def __init__(self, probes: list[Probe], *, warn: Callable[..., None],
                 passes: tuple[type[BaseException], ...] = ()) -> None:
        self._probes = list(probes)
        self._warn = warn
        # Raised through to the script: an enforced budget's OOM, and ``passes`` (the agent's stop).
        self._passes = (torch.OutOfMemoryError, *passes)
        self.context: AgentContext | None = None  # what each hook receives; the agent sets it once built

    def __iter__(self) -> Iterator[Probe]:
        return iter(list(self._probes))

    def __len__(self) -> int:
        return len(self._probes)

    def __bool__(self) -> bool:
        return bool(self._probes)

    def names(self) -> list[str]:
        return [p.name for p in self._probes]

    def call(self, probe: Probe, hook: str, *args: Any) -> Any:
        """``probe.<hook>(context, *args)``; None when it raised (and is now disabled)."""
        try:
            return getattr(probe, hook)(self.context, *args)
        except self._passes:
            raise
        except Exception as exc:  # a broken probe is reported once and switched off
            self._probes = [p for p in self._probes if p is not probe]
            self._warn(f"probe {probe.name} disabled after {hook} failed: {type(exc).__name__}: {exc}")
            return None

    def on_phase(self, phase: str, now: float) -> None:
        """The light path (every phase transition of every step): no copies."""
        for probe in self._probes:  # ``call`` replaces the list when it disables one: this loop goes on
            self.call(probe, "on_phase", phase, now)

    def call_all(self, hook: str, *args: Any, reverse: bool = False) -> list[Any]:
        """Every probe's ``hook``, in start order (``reverse``: stop order); their return values."""
        probes = list(reversed(self._probes)) if reverse else list(self._probes)
        return [self.call(probe, hook, *args) for probe in probes]

    def split(self) -> tuple[list[Probe], list[Probe]]:
        """(solo, shared): the probes that time on steps of their own (``deep_solo``), and the others."""
        solo = [p for p in self._probes if getattr(p, "deep_solo", False)]
        return solo, [p for p in self._probes if not getattr(p, "deep_solo", False)]
