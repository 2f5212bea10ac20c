"""What a rule concludes, and how every rule gets its remedies: one way, ``proposed``.

A rule (``recommend/rules/<name>.py``, ``RULE``) diagnoses: it returns a ``Finding`` named after
itself (``rule``), with its evidence and severity and no recommendations. ``proposed`` then asks
every remedy whose spec ``addresses`` that rule (``recommend/remedies/<name>.py``, ``SPEC.propose``)
for a ``Proposal``: recommendations, evidence of why it proposes nothing or what it tried, and the
lowest peak a memory remedy could reach when no plan fit. Remedies marked ``fallback`` are asked
last, and only when nothing proposed before them fits the finding's budget; they see those
recommendations on the finding. So a new remedy for an existing diagnosis is one module: no rule
names its remedies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from advisor.records.advice import Evidence, Recommendation
from advisor.records.host_memory import NO_ACCELERATOR
from advisor.records.units import fmt_bytes

if TYPE_CHECKING:  # pragma: no cover
    from advisor.recommend.profile import Profile


@dataclass(frozen=True, kw_only=True)
class Finding:
    """What one rule concluded. ``severity`` orders findings: the highest names the bottleneck.

    ``budget_bytes``: the memory budget the rule judged against (the memory rule's may come from
    an OOM when no budget is known); ``no_remedy``: what a remedy would need, said in the evidence
    when none is proposed; ``needs_remedy``: the finding is dropped when none is (a split that is
    imbalanced but has no better one is not worth a diagnosis)."""

    rule: str
    bottleneck: str
    summary: str
    severity: float
    evidence: tuple[Evidence, ...] = ()
    budget_bytes: int | None = None
    no_remedy: str | None = None
    needs_remedy: bool = False
    recommendations: tuple[Recommendation, ...] = ()
    lowest_peak_bytes: int | None = None  # the lowest peak a memory remedy reached with no plan fitting

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", tuple(self.evidence))
        object.__setattr__(self, "recommendations", tuple(self.recommendations))

    @property
    def fits(self) -> bool:
        """Whether a recommendation proposed so far fits the budget."""
        return any(r.fits and r.applicable for r in self.recommendations)

    @property
    def fits_live(self) -> bool:
        """Whether a recommendation proposed so far fits the budget and applies to the running job."""
        return any(r.fits and r.applicable and r.live for r in self.recommendations)


@dataclass(frozen=True, kw_only=True)
class Proposal:
    """A remedy's answer to a finding."""

    recommendations: tuple[Recommendation, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    lowest_peak_bytes: int | None = None  # memory: no plan fits the budget; the lowest peak one reaches

    def __post_init__(self) -> None:
        object.__setattr__(self, "recommendations", tuple(self.recommendations))
        object.__setattr__(self, "evidence", tuple(self.evidence))


Rule = Callable[["Profile"], "Finding | None"]
Propose = Callable[["Profile", Finding], Proposal]


# The waves remedies are asked in (``RemedySpec.fallback``, ``live_fallback``): first every remedy; then the fallbacks,
# when nothing proposed so far fits; then the live fallbacks (joint plans), when nothing that
# applies to the running job fits (a restart-class pipeline may fit where no live remedy does).
FIRST, FALLBACK, LIVE_FALLBACK = 0, 1, 2
WAVES = (FIRST, FALLBACK, LIVE_FALLBACK)


def proposed(profile: "Profile", finding: Finding, proposers: list[tuple[Propose, int]]) -> Finding | None:
    """``finding`` with what ``proposers`` (each ``(propose, wave)``, in order) propose for it;
    None when it ``needs_remedy`` and got none."""
    for wave in WAVES:
        if (wave == FALLBACK and finding.fits) or (wave == LIVE_FALLBACK and finding.fits_live):
            continue
        for propose, asked_in in proposers:
            if asked_in == wave:
                finding = _with(profile, finding, propose(profile, finding))
    if not finding.recommendations:
        if finding.needs_remedy:
            return None
        if finding.no_remedy:
            finding = replace(finding, evidence=finding.evidence + (Evidence(what="no remedy", value=finding.no_remedy),))
    return finding


def _with(profile: "Profile", finding: Finding, proposal: Proposal) -> Finding:
    lowest = [p for p in (finding.lowest_peak_bytes, proposal.lowest_peak_bytes) if p is not None]
    checked = tuple(_checked(profile, rec) for rec in proposal.recommendations)
    return replace(finding, recommendations=finding.recommendations + checked,
                   evidence=finding.evidence + proposal.evidence, lowest_peak_bytes=min(lowest) if lowest else None)


# Restart remedies whose plan moves device memory to the host (no applier in the training process
# to check them there).
HOST_REMEDIES = frozenset({"cpu_offload"})


def _checked(profile: "Profile", rec: Recommendation) -> Recommendation:
    """``rec``, marked not applicable where the remedy's check in the training process refused this
    job (``Profile.refusal``): ZeRO-2/3 on tied weights, an offload on a CPU-only job, a fused
    optimizer for LBFGS; a joint plan where any of its parts is refused. A restart remedy that
    moves memory to the host is refused the same way on a CPU-only job, where its host is the device. What is refused neither fits a finding (its
    fallbacks are still asked) nor is chosen or applied; it is listed last with its reason."""
    why = profile.refusal(rec.remedy, rec.params)
    for part in rec.parts:  # a joint plan applies only where every part does
        why = why or profile.refusal(part.remedy, part.params)
    if why is None and not rec.live and profile.device_type == "cpu" and rec.remedy in HOST_REMEDIES:
        why = NO_ACCELERATOR
    return rec if why is None else replace(rec, applicable=False, why=why)


def gib(n: int | float) -> str:
    return fmt_bytes(n)  # the one unit style of every surface (advisor.records.units)


def peak_categories(profile: "Profile") -> dict[str, int]:
    """Bytes by memory category at the peak (at the failed request after an OOM)."""
    if profile.oom is not None and profile.oom.categories:
        return dict(profile.oom.categories)
    return dict(profile.categories_at_peak or profile.categories_max)


def largest_category(profile: "Profile") -> str | None:
    """The memory category holding the most bytes at the peak (at the failed request after an
    OOM); None when nothing was measured. Memory remedies use it to judge their own case."""
    cats = peak_categories(profile)
    return max(cats, key=lambda k: cats[k]) if cats else None
