"""How one controller takes part in a job that spans several nodes (or several controllers).

Two ways to start one (see docs/architecture.md, "Multi-node jobs"):

- **torchrun on each node**: ``advisor attach --nnodes 2 --node-rank R --rdzv-endpoint H:P ...``
  passes torchrun's multi-node options through to ``torch.distributed.run``; the controller on
  each node hosts that node's ``--nproc-per-node`` ranks.
- **an outer launcher** (Slurm's ``srun``, or ``torchrun --no-python advisor attach ...``) that
  already set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``MASTER_ADDR`` for each process:
  every process is one controller with one training rank (no torchrun), started with that
  environment.

Either way each controller has its own session, records the global ranks it hosts and a job id
shared by every controller of the job, and only the controller that hosts global rank 0 decides
(advisor/advice.py refuses commands on the others). Torch-free: this is the controller's side.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping

from advisor.errors import UsageError
from advisor.records.settings import MultinodeSettings

# attach option -> torchrun option; the values go through as given.
TORCHRUN_OPTIONS = {
    "nnodes": "--nnodes", "node_rank": "--node-rank", "rdzv_backend": "--rdzv-backend",
    "rdzv_endpoint": "--rdzv-endpoint", "rdzv_id": "--rdzv-id", "max_restarts": "--max-restarts",
    "master_addr": "--master-addr", "master_port": "--master-port",
}
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")

HEARTBEAT_S = 1.0  # how often each agent bumps its heartbeat counter in the job's store
LOST_AFTER_S = 10.0  # a peer whose counter did not move for this long is reported lost


def add_options(parser: argparse.ArgumentParser) -> None:
    """torchrun's multi-node options on ``advisor attach`` (passed through as they are)."""
    group = parser.add_argument_group("multi-node (passed to torch.distributed.run)")
    group.add_argument("--nnodes", metavar="N|MIN:MAX", help="number of nodes (torchrun --nnodes)")
    group.add_argument("--node-rank", type=int, metavar="R", help="this node's rank (static rendezvous)")
    group.add_argument("--rdzv-backend", metavar="NAME", help="rendezvous backend, e.g. c10d (default static)")
    group.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="rendezvous endpoint, the same on every node")
    group.add_argument("--rdzv-id", metavar="ID", help="the job's id, the same on every node (also the "
                       "advisor's job id)")
    group.add_argument("--max-restarts", type=int, metavar="N", help="worker group restarts (torchrun)")
    group.add_argument("--master-addr", metavar="HOST", help="static rendezvous: rank 0's node")
    group.add_argument("--master-port", type=int, metavar="PORT", help="static rendezvous: its port")


@dataclass(frozen=True, kw_only=True)
class MultiNode:
    """One controller's place in the job. ``mode``: "single" (this controller hosts every rank),
    "torchrun" (torchrun's multi-node options, one controller per node) or "env" (an outer
    launcher's environment, one controller per process)."""

    mode: str = "single"
    options: dict[str, Any] = field(default_factory=dict)  # attach option -> value, those given
    env: dict[str, str] = field(default_factory=dict)  # the outer launcher's variables (mode "env")

    @property
    def active(self) -> bool:
        """Several controllers share the job: decisions are relayed, heartbeats kept."""
        if self.mode == "env":
            return int(self.env.get("WORLD_SIZE", "1")) > 1
        return self.mode == "torchrun"

    def torchrun_options(self) -> list[str]:
        """torchrun's options for a multi-node job; on one node (``--standalone``) only
        ``--max-restarts``, the one that still means something there."""
        if self.mode == "torchrun":
            return [f"{TORCHRUN_OPTIONS[k]}={v}" for k, v in self.options.items()]
        if self.mode == "single" and self.options.get("max_restarts") is not None:
            return ["--standalone", f"--max-restarts={self.options['max_restarts']}"]
        return []

    @property
    def restarts(self) -> int:
        """How many times torchrun may start this node's workers again (``--max-restarts``)."""
        try:
            return max(0, int(self.options.get("max_restarts") or 0))
        except (TypeError, ValueError):
            return 0

    def uses_torchrun(self, nproc_per_node: int) -> bool:
        return self.mode == "torchrun" or (self.mode == "single" and nproc_per_node > 1)

    def job_id(self) -> tuple[str | None, str]:
        """(the id every controller of the job computes alike, where it came from)."""
        if self.options.get("rdzv_id") is not None:
            return str(self.options["rdzv_id"]), "rdzv_id"
        if self.mode == "env":
            run_id = self.env.get("TORCHELASTIC_RUN_ID")
            if run_id and run_id != "none":
                return run_id, "TORCHELASTIC_RUN_ID"
            if self.env.get("SLURM_JOB_ID"):
                step = self.env.get("SLURM_STEP_ID")
                return f"slurm-{self.env['SLURM_JOB_ID']}" + (f".{step}" if step else ""), "SLURM_JOB_ID"
            where = f"{self.env.get('MASTER_ADDR')}:{self.env.get('MASTER_PORT', '')}"
            return "job-" + _digest(where, self.env.get("WORLD_SIZE", "")), "MASTER_ADDR:MASTER_PORT"
        if self.mode == "torchrun":
            o = self.options
            where = o.get("rdzv_endpoint") or f"{o.get('master_addr')}:{o.get('master_port')}"
            return ("job-" + _digest(str(o.get("rdzv_backend") or "static"), str(where), str(o.get("nnodes"))),
                    "rendezvous endpoint (no --rdzv-id)")
        return None, "single"

    def describe(self, *, nproc_per_node: int) -> dict[str, Any]:
        """The session's ``job`` metadata at start; ranks are added as agents say hello."""
        job_id, source = self.job_id()
        out: dict[str, Any] = {"id": job_id, "id_source": source, "launcher": self.mode,
                               "hostname": socket.gethostname(), "ranks_hosted": [], "world_size": None,
                               "token": None}
        if self.mode == "torchrun":
            out.update(nnodes=self.options.get("nnodes"), node_rank=self.options.get("node_rank"),
                       nproc_per_node=nproc_per_node)
        elif self.mode == "env":
            out.update(rank=int(self.env["RANK"]), local_rank=int(self.env.get("LOCAL_RANK", "0")),
                       world_size=int(self.env["WORLD_SIZE"]))
        return out

    def agent_settings(self) -> MultinodeSettings:
        """What every agent of a multi-controller job is told (``AgentSettings.multinode``)."""
        return MultinodeSettings(relay=True, heartbeat_s=HEARTBEAT_S, lost_after_s=LOST_AFTER_S)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def from_namespace(ns: argparse.Namespace, environ: Mapping[str, str] | None = None) -> MultiNode:
    """The attach command line and the environment -> this controller's ``MultiNode``;
    ``UsageError`` for combinations that cannot work."""
    environ = os.environ if environ is None else environ
    given = {k: getattr(ns, k) for k in TORCHRUN_OPTIONS if getattr(ns, k, None) is not None}
    outer = [k for k in LAUNCHER_ENV if k in environ]
    torchrun_given = {k: v for k, v in given.items() if k != "rdzv_id"}
    if torchrun_given:
        if outer == list(LAUNCHER_ENV):
            raise UsageError("RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR are already set by an outer "
                             "launcher: torchrun's multi-node options do not apply",
                             hint="drop --nnodes/--rdzv-* (each process is one rank), or unset those variables")
        nnodes = str(given.get("nnodes", "1"))
        if nnodes in ("1", "1:1") and not (set(torchrun_given) - {"nnodes", "max_restarts"}):
            return MultiNode(mode="single", options=given)
        if "rdzv_endpoint" not in given and "master_addr" not in given:
            raise UsageError("a multi-node job needs a rendezvous: --rdzv-endpoint HOST:PORT (c10d) or "
                             "--master-addr HOST --master-port PORT (static)",
                             hint="the same value on every node, e.g. --rdzv-backend c10d --rdzv-endpoint node0:29400")
        return MultiNode(mode="torchrun", options=given)
    if outer == list(LAUNCHER_ENV):
        try:
            rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
            int(environ["LOCAL_RANK"])
        except ValueError:
            raise UsageError("RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers",
                             hint="check what the launcher exports, e.g. RANK=$SLURM_PROCID") from None
        if not 0 <= rank < world:
            raise UsageError(f"RANK={rank} is not in [0, WORLD_SIZE={world})", hint="check the launcher's variables")
        if ns.nproc_per_node != 1:
            raise UsageError("RANK and WORLD_SIZE are already set by an outer launcher: each process is one "
                             "rank, so --nproc-per-node does not apply",
                             hint="start one `advisor attach` per rank (srun --ntasks-per-node=N ...)")
        keep = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                "SLURM_JOB_ID", "SLURM_STEP_ID")
        return MultiNode(mode="env", options=given, env={k: environ[k] for k in keep if k in environ})
    if outer and "RANK" in outer:
        missing = [k for k in LAUNCHER_ENV if k not in environ]
        raise UsageError(f"RANK is set but {', '.join(missing)} not: an outer launcher must set all of "
                         f"{', '.join(LAUNCHER_ENV)}", hint="e.g. under Slurm: RANK=$SLURM_PROCID "
                         "LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS MASTER_ADDR=<first node>")
    return MultiNode(mode="single", options=given)
