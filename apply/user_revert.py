"""A revert the user asks for, agreed by every rank like a keep-or-revert decision.

Why: the remedy in force may be a layout change (ZeRO-1 brings its dropped optimizer state back
from each parameter's owner: a collective), so one rank reverting at its next boundary while
another runs a step still remedied would hang or diverge the job. The controller therefore sends
the revert with an explicit ``at_step`` (one past the furthest rank, as for an apply), every rank
reverts at that boundary, and first votes over the same ``Agreement`` as keep/revert, with the
digest of (the revert's step, the apply it undoes): a rank that would undo another apply, or a
vote that fails or times out, is reported in the revert's reason. The outcome is a revert on
every rank in any case: each was asked to revert, and reverting is what any failure of an
agreement does. A revert without ``at_step`` (one process, or an older controller) is not voted:
the ranks' next boundaries could be different steps, and a vote there would wait on a rank that
is blocked in the job's own collectives.
"""

from __future__ import annotations

from advisor.apply.agreement import Agreement
from advisor.records.remedy import command_digest


def vote_user_revert(agreement: Agreement, *, in_force: str | None, at_step: int) -> str | None:
    """Vote at the boundary ``at_step`` (every rank calls it there); what the revert's reason
    should add (ranks disagreed, or the vote failed), or None when all agreed."""
    digest = command_digest("revert", {"undoes": in_force}, at_step)
    # Every rank votes revert, so the only reasons are digests that differ or a failed collective.
    return agreement.vote(revert=True, digest=digest).reason
