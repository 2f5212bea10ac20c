"""One fit, around the script's run in the training process: the fake world, and what it saw.

``FitRun(agent)`` is the context ``advisor.agent.bootstrap`` enters around the script
(``around_script``). It builds the fake world for the agent's ``AgentSettings.fit``, lets the
script run in it under the agent (whose probes record memory, FLOPs and collectives as for any
attach), and at the end sends one ``fit`` event: the steps run, where the run stopped, the reads
that got a placeholder, the process groups of more than one rank (NCCL communicators on the
target), or why the script could not be run (``unrunnable``, then the run ends as stopped).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch.distributed as dist

from advisor.agent.agent import StopTraining
from advisor.agent.bootstrap import SESSION_ENV
from advisor.agent.probe_registry import device_info
from advisor.fit.reads import FitUnrunnable, Reads, raising_frame
from advisor.fit.world import FitWorld
from advisor.fit.writes import FOLDER, Shadow
from advisor.probes.memory.probe import MemoryProbe
from advisor.records.fit import FIT_STEPS
from advisor.records.samples import RunInfo



class FitRun:
    def __init__(self, agent: Any, run_info: RunInfo) -> None:
        settings = agent.settings.fit
        if settings is None:
            raise RuntimeError("advisor fit: the training process was started without fit settings")
        self.agent = agent
        self.settings = settings
        self.reads = Reads(steps=FIT_STEPS, steps_done=lambda: agent.step, stop=StopTraining)
        self.shadow = Shadow(_writes_folder(), keep=_kept_folders())
        self.world = FitWorld(settings, self.reads, tracked=self._tracked, shadow=self.shadow)
        self.run_info = run_info

    def _tracked(self) -> int:
        for probe in self.agent.probes:
            if isinstance(probe, MemoryProbe) and probe.tracker is not None:
                return probe.tracker.device_total()
        return 0

    def __enter__(self) -> "FitRun":
        self.world.__enter__()
        if self.settings.device is not None:  # the run's device is the target, as the script sees it
            self.agent.outbox.emit(replace(self.run_info, device=device_info(0)))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        communicators = _communicators()
        self.world.__exit__(exc_type, exc, tb)
        log = self.reads.log
        # An error after a whole step, outside any op (``.numpy()`` in dcgan's save_image, a data
        # pointer): fake tensors have no data. The steps before it are measured: stop cleanly there.
        stopped = (isinstance(exc, Exception) and not isinstance(exc, StopTraining) and self.agent.step >= 1
                   and log.stopped_by is None)
        if stopped:
            log.stopped_at = raising_frame(tb)
            log.stopped_by = {"op": f"{type(exc).__name__}: {exc}"[:300], "kind": "data", "step": self.agent.step}
        stopped_by = log.stopped_by
        if stopped_by is not None and isinstance(stopped_by.get("step"), int) and stopped_by["step"] >= 1:
            stopped_by = {**stopped_by, "ran_share": ran_share(self.world.mode.ops_by_step, stopped_by["step"])}
        data: dict[str, Any] = {
            "target": self.settings.target, "world_size": self.settings.world_size,
            "steps": self.agent.step, "steps_wanted": FIT_STEPS, "stopped_at": log.stopped_at,
            "stopped_by": stopped_by,
            "placeholders": _reads(log.placeholders), "early_reads": _reads(log.early),
            "solver_reads": [{"solver": name, "count": n} for name, n in sorted(self.reads.solvers.counts.items())],
            "estimated_shapes": [{"file": f, "line": line, "code": code, "op": op, "count": n, "rows": rows}
                                 for (f, line, code, op), (n, rows) in sorted(self.world.mode.sparsity.sized.items())],
            "communicators": communicators,
            "writes_folder": str(self.shadow.root), "writes": self.shadow.redirected(),
            "created": self.shadow.created(),
            "draws": {"replayed_elements": self.world.mode.draws.replayed, "not_replayed": dict(self.world.mode.draws.left)},
        }
        if isinstance(exc, FitUnrunnable):
            data["unrunnable"] = {"message": str(exc), "kind": exc.kind, "op": exc.op, "where": exc.where}
        self.agent.outbox.event("fit", data, step=None)
        if isinstance(exc, FitUnrunnable):  # said in the event; the controller reports it
            raise StopTraining(f"advisor fit: {exc}") from None
        if stopped:
            raise StopTraining(f"advisor fit: stopped early after {self.agent.step} step(s): the script raised "
                               f"{type(exc).__name__} reading data that fake tensors do not have") from None


def ran_share(ops_by_step: dict[int, int], step: int) -> float | None:
    """The ops of ``step`` that ran before the op that stopped it, over the ops of the whole step
    before it (at most 1); None without that step. What of the stopped step the figures leave out."""
    whole = ops_by_step.get(step - 1)
    if not whole:
        return None
    return round(min(1.0, ops_by_step.get(step, 0) / whole), 4)


def _kept_folders() -> tuple[Path, ...]:
    """Folders the script's writes are never redirected from: the advisor's home (the session
    folder's grandparent, ``$ADVISOR_HOME/sessions/<id>``)."""
    session = os.environ.get(SESSION_ENV)
    return (Path(session).parent.parent,) if session else ()


def _writes_folder() -> Path:
    """``<session>/writes``: where the script's file writes go (a fresh temporary folder when the
    process was not started by ``advisor fit``, in tests)."""
    session = os.environ.get(SESSION_ENV)
    return Path(session) / FOLDER if session else Path(tempfile.mkdtemp(prefix="advisor-fit-")) / FOLDER


def _reads(counts: dict[tuple[str, int, str], int]) -> list[dict[str, Any]]:
    return [{"file": f, "line": line, "code": code, "count": n} for (f, line, code), n in sorted(counts.items())]


def _communicators() -> list[int]:
    """The size of each process group of more than one rank the script made (each is an NCCL
    communicator per device on the target)."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    import torch.distributed.distributed_c10d as c10d

    sizes = []
    for group in list(c10d._world.pg_map):
        try:
            size = group.size()
        except RuntimeError:
            continue
        if size > 1:
            sizes.append(size)
    return sorted(sizes, reverse=True)



