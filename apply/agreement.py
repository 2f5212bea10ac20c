"""Keep-or-revert decided by all ranks together, never by one alone.

Why: a remedy that one rank keeps and another reverts leaves the ranks running different
programs; for a sharding change that hangs the job at its next collective. So every decision
point (right after an apply, and at the end of the measurement window) ends in one
``all_reduce(MAX)`` of a small int64 tensor ``[revert, digest, -digest]`` over a gloo group of the
job's ranks:

- ``revert`` is 1 on a rank that failed, exceeded its budget or measured a slowdown: the max is
  1 when any rank wants out, and then all revert;
- ``digest`` is the first 60 bits of the command's sha256: max(d) == -max(-d) iff every rank
  enacts the same command; a mismatch reverts too.

The group is a dedicated gloo group, created once (a collective call, made by every rank at the
same boundary, since all ranks apply at the same step): gloo runs on CPU tensors whatever the
job's backend (an NCCL job would otherwise need a device tensor and a stream sync), and it has
its own timeout, ``timeout_s``. A timeout or any error of the collective counts as a revert: it
never hangs the job longer than the timeout.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from advisor.records.settings import AGREE_TIMEOUT_S

logger = logging.getLogger("advisor.apply")

DEFAULT_TIMEOUT_S = AGREE_TIMEOUT_S  # AgentSettings.apply_agree_timeout_s's default


@dataclass(frozen=True, kw_only=True)
class Verdict:
    revert: bool  # True: every rank must revert
    reason: str | None = None  # why, when revert comes from another rank or the collective


def _digest_int(digest: str | None) -> int:
    return int(digest[:15], 16) if digest else 0  # 60 bits: fits int64 with its negation


class Agreement:
    """All-ranks keep/revert votes over the job's ranks (a no-op on a single process)."""

    def __init__(self, *, process_group: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._job_group = process_group
        self.timeout_s = float(timeout_s)
        self._group: Any = None

    @staticmethod
    def distributed() -> bool:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _gloo_group(self) -> Any:
        if self._group is None:
            ranks = None
            if self._job_group is not None and self._job_group is not dist.group.WORLD:
                ranks = dist.get_process_group_ranks(self._job_group)
            self._group = dist.new_group(ranks=ranks, backend="gloo",
                                         timeout=datetime.timedelta(seconds=self.timeout_s))
        return self._group

    def bind(self, process_group: Any) -> None:
        """Vote among the ranks of ``process_group`` (the job's, from the target); before the first vote."""
        if self._group is None:
            self._job_group = process_group

    def vote(self, *, revert: bool, digest: str | None) -> Verdict:
        """Every rank calls this at the same boundary; returns what all of them will do."""
        return self.vote_each([revert], digest=digest)[0]

    def vote_each(self, reverts: list[bool], *, digest: str | None) -> list[Verdict]:
        """One vote per item (a plan's entries), in one collective; same call order on every rank."""
        if not self.distributed():
            return [Verdict(revert=r) for r in reverts]
        d = _digest_int(digest)
        tensor = torch.tensor([*(int(r) for r in reverts), d, -d], dtype=torch.int64)
        try:
            work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._gloo_group(), async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:  # a timeout, or a peer that died: revert, do not hang
            logger.warning("Keep/revert agreement failed, reverting: %s", exc)
            reason = (f"ranks could not agree within {self.timeout_s:g} s ({type(exc).__name__}); "
                      "reverted everywhere")
            return [Verdict(revert=True, reason=reason) for _ in reverts]
        *flags, high, neg_low = (int(v) for v in tensor.tolist())
        if high != -neg_low:
            reason = "ranks received different commands (digests differ); reverted"
            return [Verdict(revert=True, reason=reason) for _ in reverts]
        out = []
        for mine, anyone in zip(reverts, flags):
            if anyone and not mine:
                out.append(Verdict(revert=True, reason="another rank failed or did not keep the remedy; "
                                                       "all ranks reverted"))
            else:
                out.append(Verdict(revert=bool(anyone)))
        return out
