"""Test doubles shared by the test modules.

``FakeContext`` implements ``advisor.records.context.AgentContext`` and
``advisor.apply.host.ExecutorHost`` for driving a probe or the apply executor by hand, without
the agent's global hooks.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from advisor.apply.target import Target
from advisor.records.samples import Record, RecordTable, StepSample
from advisor.records.settings import AgentSettings


class FakeContext:
    """A hand-driven agent context: tests set ``step``/``phase`` and call probe hooks."""

    def __init__(
        self,
        models: list[torch.nn.Module] | None = None,
        optimizers: list[torch.optim.Optimizer] | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        settings: AgentSettings | None = None,
    ) -> None:
        self._models = list(models or [])
        self._optimizers = list(optimizers or [])
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device("cpu")
        self.settings = settings if settings is not None else AgentSettings()
        self.step = 0
        self.phase = "data"
        self.step_start = time.perf_counter()
        self.emitted: list[Record] = []
        self.tables: list[RecordTable] = []  # the tables emitted (their rows are in ``emitted``)
        self.deep_requests: list[int] = []
        self.deep_released: list[tuple[str, ...]] = []
        self.backward = False
        # The executor's side: tests set these as the agent would have them.
        self.recent_steps: list[StepSample] = []
        self.relayed = False
        self.holding = False

    def models(self) -> list[torch.nn.Module]:
        return list(self._models)

    def wrapped_models(self) -> list[torch.nn.Module]:
        return list(self._models)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return list(self._optimizers)

    def module_name(self, module: torch.nn.Module) -> str | None:
        for root in self._models:
            for name, sub in root.named_modules():
                if sub is module:
                    return name
        return None

    def in_backward(self) -> bool:
        return self.backward or torch._C._current_graph_task_id() != -1

    def emit(self, record: Record) -> None:
        if isinstance(record, RecordTable):  # as the controller folds it: the records it stands for
            self.emitted.extend(record.records())
            self.tables.append(record)
        else:
            self.emitted.append(record)

    def request_deep(self, steps: int, probes=None) -> None:
        self.deep_requests.append(steps)

    def deep_next(self) -> bool:
        return False

    def release_deep(self, probes) -> None:
        self.deep_released.append(tuple(probes))

    def of_kind(self, kind: str) -> list[Record]:
        return [r for r in self.emitted if r.KIND == kind]

    def target(self) -> Target:
        group = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
        return Target(wrapped_models=self.wrapped_models(), optimizers=self.optimizers(), process_group=group,
                      device=self.device, rank=self.rank, world_size=self.world_size)

    def holds_before(self, step: int) -> bool:
        return False

    def device_step_times(self) -> dict[int, float]:
        return {}


class Emitted(list):
    """A list an agent emits into (``Agent(emit=emitted.append)``) that holds a table's rows as the
    records they stand for, as the controller folds them (advisor/records/table.py)."""

    def append(self, record: Record) -> None:
        if isinstance(record, RecordTable):
            self.extend(record.records())
        else:
            super().append(record)


def saved_bytes(run: Callable[[], object]) -> int:
    """The bytes of every storage autograd saves for backward while ``run()`` runs."""
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(saved)
