"""Host-overhead rule: the device idles between kernels (CUDA), or on CPU the ops cover a small
share of the step; its remedies are ``torch.compile`` of the repeated blocks (``repeated_blocks``)
and, on CUDA, CUDA graphs (``recommend/remedies/compile_blocks.py``, ``cuda_graphs.py``).

Evidence: op (kernel) time (``Profile.ops``) against the time of the very steps it was measured
on, less their data wait (``Profile.step_times``): ops are timed on deep steps, which the probes
slow down several times over, so they are compared with deep steps, never with light ones. The
rest is the host gap (Python, dispatch, launches). The rule fires when the ops cover less than
``OP_COVERAGE`` of that time; the gap of an ordinary step is its time less data wait times
``1 - coverage`` (``host_gap``, which the remedies read too).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.recommend.rules._figures import ms, op_time_per_step
from advisor.records.advice import Evidence

NAME = "host_overhead"
OP_COVERAGE = 0.5  # op time below this share of the (non-data) step: the host dominates


def repeated_blocks(profile: Profile) -> list[str]:
    """The shallowest module type that occurs twice or more (transformer layers, res blocks);
    ``[""]`` (the whole model) when nothing repeats."""
    counts = Counter((m.depth, m.type) for m in profile.modules if m.name and m.type)
    repeated = [(depth, -n, t) for (depth, t), n in counts.items() if n >= 2 and _has_children(profile, t)]
    if not repeated:
        return [""]
    depth, _, kind = min(repeated)
    return sorted((m.name for m in profile.modules if m.depth == depth and m.type == kind),
                  key=lambda n: [int(p) if p.isdigit() else p for p in n.split(".")])


def _has_children(profile: Profile, kind: str) -> bool:
    """A block is a module with submodules (two Linear layers are not worth compiling alone)."""
    return any(profile.children(m.name) for m in profile.modules if m.type == kind)


@dataclass(frozen=True, kw_only=True)
class HostGap:
    """What the host-overhead rule measured: the step's time outside the ops (seconds)."""

    step_s: float
    busy_s: float  # the step less its data wait
    base_s: float  # what the op time is compared with: an ordinary step (CUDA) or a deep one (CPU)
    op_time_s: float
    coverage: float  # op time / base
    gap_s: float  # host time per step outside the ops
    cuda: bool
    ordinary: bool = False  # the op times are on an ordinary step's base (CUDA kernels, inline CPU times)

    @property
    def where(self) -> str:
        return "the device idles between kernels" if self.cuda else "the ops cover a small share of the step"

    def lines(self) -> list[str]:
        kind = "ordinary" if self.ordinary else "deep"
        return [f"ops {ms(self.op_time_s)} of a {ms(self.base_s)} {kind} step less data wait ({self.coverage:.0%})",
                f"host gap {ms(self.gap_s)} of a {ms(self.busy_s)} step"]


def host_gap(profile: Profile) -> HostGap | None:
    """The host gap, when the ops cover less than ``OP_COVERAGE`` of the step; None otherwise."""
    step = profile.step_time_s
    if not step or not profile.ops:
        return None
    busy = step - (profile.phases.get("data_s") or 0.0)
    measured = sorted({o.step for o in profile.ops} & set(profile.step_times))
    deep_busy = sum(profile.step_times[i][0] - profile.step_times[i][1] for i in measured) / max(1, len(measured))
    op_time = op_time_per_step(profile.ops)
    cuda = profile.device.type == "cuda"
    # CUDA op times are kernel times, which the profiler does not slow: compare them with an
    # ordinary step; so are op times taken inside the counting mode (``OpStat.inline``, each op's
    # own run). CPU op times from a profiled step are slowed with it: compare like with like.
    ordinary = cuda or all(o.inline for o in profile.ops)
    base = busy if ordinary else deep_busy
    if busy <= 0 or base <= 0 or op_time <= 0 or op_time >= OP_COVERAGE * base:
        return None
    coverage = op_time / base
    return HostGap(step_s=step, busy_s=busy, base_s=base, op_time_s=op_time, coverage=coverage,
                   gap_s=busy * (1.0 - coverage), cuda=cuda, ordinary=ordinary)


def host_overhead_rule(profile: Profile) -> Finding | None:
    gap = host_gap(profile)
    if gap is None:
        return None
    evidence = (
        Evidence(what="op time / step time less data wait (" + ("ordinary steps" if gap.ordinary else "deep steps") + ")",
                 value=round(gap.coverage, 4), threshold=OP_COVERAGE),
        Evidence(what="host gap per step", value=round(gap.gap_s, 6), unit="s"),
        Evidence(what="op time per deep step", value=round(gap.op_time_s, 6), unit="s"),
    )
    return Finding(rule=NAME, bottleneck="launch_overhead",
                   summary=f"host overhead: {gap.where} ({gap.coverage:.0%} op time)",
                   severity=gap.gap_s / gap.step_s, evidence=evidence)


RULE = host_overhead_rule
