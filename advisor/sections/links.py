"""Report section ``comm_links``: collectives within one node and across nodes, and the bus
bandwidth of each (docs/report-schema.md).

Which ranks share a node: in a torchrun multi-node job, the ranks one node's controller hosted
(``job.sessions[].ranks`` of a merged report; in one node's own session, its hosted ranks, and
every other rank is on another node); otherwise (one node, or an outer launcher with one
controller per process) the ``hostname`` each rank's agent reported (``RunInfo``).

Which ranks a call spans: the global ranks of its group where the record names them
(``CollectiveStat.group_ranks``: the comm probe records them for a group smaller than the world);
else, a call whose group has the job's whole world size spans every rank. A smaller group whose
members are not recorded (sessions of agents before the field, trace imports) is ``unknown``, as
are calls whose ranks' nodes are not all known. Bus bandwidth follows nccl-tests (advisor/records/
bandwidth.py) over the transfer time: the call's time less its wait for the latest rank.
"""

from __future__ import annotations

from typing import Any

from advisor.blocks import Block, Column, Table
from advisor.recommend.comm import wait_by_record
from advisor.records.bandwidth import busbw
from advisor.records.units import fmt_bytes, fmt_rate, fmt_seconds
from advisor.rich_text import to_rich
from advisor.state import SessionState


def rank_nodes(state: SessionState) -> tuple[dict[int, str], set[int] | None]:
    """(rank -> node label, for the ranks whose node is known; the ranks of this session's node
    when the others are known to be elsewhere, else None)."""
    job = state.job or {}
    if job.get("launcher") == "torchrun":
        sessions = job.get("sessions") or []
        if sessions:
            nodes = {int(r): f"node{s.get('node_rank') if s.get('node_rank') is not None else i}"
                     for i, s in enumerate(sessions) for r in s.get("ranks") or []}
            return nodes, None
        here = {int(r) for r in job.get("ranks_hosted") or state.runs}
        label = f"node{job.get('node_rank')}" if job.get("node_rank") is not None else "this node"
        return {r: label for r in here}, here
    return {rank: run.hostname for rank, run in state.runs.items() if run.hostname}, None


def classify(group_size: int, world_size: int, nodes: dict[int, str], here: set[int] | None,
             group_ranks: list[int] | None = None) -> str:
    """"intra_node", "inter_node" or "unknown" for one call of a group of ``group_size`` ranks whose
    global ranks are ``group_ranks`` (None: not recorded, known only when the group is the world)."""
    members: list[int] | range
    if group_ranks:
        members = group_ranks
    elif group_size == world_size and world_size >= 2:
        members = range(world_size)
    else:
        return "unknown"
    if here is not None and any(r not in here for r in members):
        return "inter_node"  # torchrun runs one controller per node: the other ranks are elsewhere
    labels = {nodes.get(r) for r in members}
    if None in labels:
        return "unknown"
    return "intra_node" if len(labels) == 1 else "inter_node"


def build_links_section(state: SessionState) -> dict[str, Any] | None:
    """``{"nodes": {label: [ranks]}, "links": [row, ...]}``, None without collectives. One row per
    (link, op, group size): ``calls``, ``bytes`` (summed), ``transfer_s`` (summed time less waits,
    seconds) and ``busbw`` (bytes per second over that transfer time)."""
    calls = [c for c in state.collectives if c.group_size > 1]
    if not calls:
        return None
    nodes, here = rank_nodes(state)
    waits, _ = wait_by_record(state.collectives, state.events)
    world = state.world_size
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    for c in calls:
        link = classify(c.group_size, world, nodes, here, c.group_ranks)
        row = rows.setdefault((link, c.op, c.group_size), {"link": link, "op": c.op, "group_size": c.group_size,
                                                           "calls": 0, "bytes": 0, "transfer_s": 0.0, "ranks": set()})
        wait = min(c.time_s, max(c.wait_s, waits.get(id(c), 0.0)))
        row["calls"] += c.count
        row["bytes"] += c.bytes * c.count
        row["transfer_s"] += max(0.0, c.time_s - wait)
        row["ranks"].add(c.rank)
    out = []
    for key in sorted(rows):
        row = rows[key]
        row["ranks"] = sorted(row["ranks"])
        row["busbw"] = busbw(row["op"], row["bytes"], row["transfer_s"], row["group_size"])
        out.append(row)
    by_node: dict[str, list[int]] = {}
    for rank, label in sorted(nodes.items()):
        by_node.setdefault(label, []).append(rank)
    return {"nodes": by_node, "links": out}


def links_blocks(section: dict[str, Any] | None) -> list[Block]:
    """The links' table, when any call crossed nodes (``advisor.blocks``)."""
    if not section or not any(row["link"] == "inter_node" for row in section["links"]):
        return []
    return [Table(
        title="Collectives within and across nodes "
              + " · ".join(f"{label}: ranks {ranks}" for label, ranks in section["nodes"].items()),
        columns=(Column(name="link", label=True), Column(name="op", label=True),
                 *(Column(name=c, numeric=True) for c in ("n", "calls", "bytes", "transfer", "busbw"))),
        rows=tuple((row["link"].replace("_", "-"), row["op"], str(row["group_size"]), str(row["calls"]),
                    fmt_bytes(row["bytes"]), fmt_seconds(row["transfer_s"]), fmt_rate(row["busbw"]))
                   for row in section["links"]))]


def render_links_section(section: dict[str, Any] | None) -> list[Any]:
    """Rich renderables of ``links_blocks``."""
    return [to_rich(block) for block in links_blocks(section)]
