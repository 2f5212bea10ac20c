"""Test doubles shared by the test modules.

``FakeContext`` implements ``advisor.probes.probe.AgentContext`` for driving a probe or
the apply executor by hand, without the agent's global hooks.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from advisor.records.samples import Record


class FakeContext:
    """A hand-driven agent context: tests set ``step``/``phase`` and call probe hooks."""

    def __init__(
        self,
        models: list[torch.nn.Module] | None = None,
        optimizers: list[torch.optim.Optimizer] | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        config: dict[str, Any] | None = None,
    ) -> None:
        self._models = list(models or [])
        self._optimizers = list(optimizers or [])
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device("cpu")
        self.config = dict(config or {})
        self.step = 0
        self.phase = "data"
        self.step_start = time.perf_counter()
        self.emitted: list[Record] = []
        self.deep_requests: list[int] = []
        self.backward = False

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
        self.emitted.append(record)

    def request_deep(self, steps: int, probes=None) -> None:
        self.deep_requests.append(steps)

    def deep_next(self) -> bool:
        return False

    def of_kind(self, kind: str) -> list[Record]:
        return [r for r in self.emitted if r.KIND == kind]
